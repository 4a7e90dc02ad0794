#!/usr/bin/env bash
# The main job: install what is needed, build, and run the demo training step under
# mpirun -np 4 with streamcoll preloaded, printing the statistics table. Device buffers
# when a GPU is present, host buffers otherwise.
#   scripts/demo.sh [demo options, e.g. --iters 50 --count 1048576, or --stream]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build=${BUILD_DIR:-build}
case $build in /*) lib=$build/libstreamcoll.so ;; *) lib=$PWD/$build/libstreamcoll.so ;; esac
np=${NP:-4}
mpi_args=(-np "$np")
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  mpi_args+=(--oversubscribe --bind-to none)
  [ "$(id -u)" -eq 0 ] && mpi_args+=(--allow-run-as-root)
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
fi
LD_PRELOAD="$lib" STREAMCOLL_STATS=1 \
  mpirun "${mpi_args[@]}" "$build/examples/demo" "$@"
