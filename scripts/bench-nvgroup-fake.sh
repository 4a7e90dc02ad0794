#!/usr/bin/env bash
# Route nvgroup's enqueue cost against the fake CUDA driver: the host time of one
# stream-ordered 8-byte MPI_Allreduce (GOAL: median <= 10 us), NP ranks (default 2) sharing
# fake GPUs, the kernels run as host code when the stream is synchronised after each batch
# of 100 calls. Statistics off (they cost a little per call). Keep a result with e.g.
#   scripts/bench-nvgroup-fake.sh 2 2>&1 | tee bench/results/nvgroup_enqueue_fake_2ranks.txt
#   scripts/bench-nvgroup-fake.sh [NP] [BATCHES (default 50)]
# NVGROUP_PARAMS=":direct=no" (appended to the route) compares without registered inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
batches=${2:-50}
scripts/build.sh >/dev/null
build=${BUILD_DIR:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
[ -x "$build/tests/fake/fake_nvgroup_route" ] || { echo "no $build/tests/fake/fake_nvgroup_route (built without nvcc?)" >&2; exit 1; }
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
mpi_args=("${mpirun_args[@]}" -np "$np")
echo "# ${NVGROUP_PARAMS:+NVGROUP_PARAMS=$NVGROUP_PARAMS }scripts/bench-nvgroup-fake.sh $*"
echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'); $(date -u +%Y-%m-%dT%H:%M:%SZ); $(nproc) cores"
echo "# fake CUDA driver (no GPU): FAKE_CUDA_DEFER=1 FAKE_CUDA_BUS_ID=same FAKE_CUDA_DEVICES=$np FAKE_CUDA_MALLOC_SHM=1 (inputs registered, read in place)"
LD_PRELOAD="$build/libstreamcoll.so" LD_LIBRARY_PATH="$build/tests/fake/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  STREAMCOLL_ROUTE="allreduce:nvgroup${NVGROUP_PARAMS:-}" STREAMCOLL_NCCL_LIB=/nonexistent/libnccl.so.2 \
  FAKE_CUDA_DEFER=1 FAKE_CUDA_BUS_ID=same FAKE_CUDA_DEVICES="$np" FAKE_CUDA_MALLOC_SHM=1 \
  "$mpirun" "${mpi_args[@]}" "$build/tests/fake/fake_nvgroup_route" enqueue "$batches"
