// Route nvgroup's kernels' module, loaded once per device and process
// (nvgroup_module.cpp): what the route's other files need of it. Internal to the route's
// files.
#pragma once

#include <cuda.h>

#include <optional>
#include <string>

#include "algorithms/nvgroup_kernel.hpp"
#include "core/datatypes.hpp"

namespace streamcoll::nvgroup_detail {

// The kernels' element type and op (nvgroup_kernels::type_of, op_of).
std::optional<nvgroup::DType> kernel_type(const TypeInfo& t);
std::optional<nvgroup::ROp> kernel_op(OpKind k);

// Whether the CUDA driver has every entry point the route uses.
bool driver_has_entry_points();

// The route's kernel (streamcoll_nvgroup_allreduce) on `device` (`dev`), its module loaded
// there at the first call; null, with the reason in *why.
CUfunction kernel_for(int device, CUdevice dev, std::string* why);

// At MPI_Finalize: the kernels' modules unloaded, their contexts released.
void unload_modules();

}  // namespace streamcoll::nvgroup_detail
