#!/usr/bin/env bash
# Collectives captured into a CUDA graph (docs/guide.md, "CUDA graphs"): the host time of a
# step of K small MPI_Allreduce calls (8 doubles each) on a communicator's stream, made
# live and replayed from a graph captured once (tests/fake/capture.cpp, mode bench),
# per route. Rank 0 prints, per K: the host time to issue the step (the K calls, or one
# cuGraphLaunch), the time to the end of the step (stream synchronised), and the issue
# time per call; medians of 200 steps. Against the fake CUDA driver and NCCL of tests/fake
# (no GPU needed; FAKE_CUDA_DIR= empty to use the installed driver on a GPU node).
#   scripts/bench-capture.sh [NP]      (default 2 ranks)
# BUILD_DIR: the build folder (default build); SC_CAPTURE_ROUTES: routes (default
# "nccl ht").
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
build=${BUILD_DIR:-build}
fake=${FAKE_CUDA_DIR-$PWD/$build/tests/fake/cuda}
read -r -a routes <<< "${SC_CAPTURE_ROUTES:-nccl ht}"
ninja -C "$build" tests/fake/fake_capture >/dev/null
mpi=(mpirun -np)
openmpi=0
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  openmpi=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  [ "$(id -u)" -eq 0 ] && mpi=(mpirun --allow-run-as-root -np)
fi
for route in "${routes[@]}"; do
  echo "== route $route, $np ranks"
  env=(STREAMCOLL_ROUTE="allreduce:$route" STREAMCOLL_THREAD_MULTIPLE=1
       LD_PRELOAD="$PWD/$build/libstreamcoll.so")
  if [ -n "$fake" ]; then
    env+=(LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
          STREAMCOLL_NCCL_LIB="$PWD/$build/tests/fake/libfakenccl.so"
          FAKE_CUDA_BUS_ID=per-rank FAKE_CUDA_GPU_PROGRESS_MS=1)
  fi
  if [ $openmpi = 1 ]; then  # (mpirun passes the environment on with -x)
    xs=()
    for e in "${env[@]}"; do xs+=(-x "$e"); done
    "${mpi[@]}" "$np" "${xs[@]}" "$build/tests/fake/fake_capture" bench
  else
    env "${env[@]}" "${mpi[@]}" "$np" "$build/tests/fake/fake_capture" bench
  fi
done
