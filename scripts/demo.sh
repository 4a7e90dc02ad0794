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
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
LD_PRELOAD="$lib" STREAMCOLL_STATS=1 \
  "$mpirun" "${mpirun_args[@]}" -np "$np" "$build/examples/demo" "$@"
