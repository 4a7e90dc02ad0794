#!/usr/bin/env bash
# Persistent collectives (docs/guide.md, "Persistent collectives"): the host time per call
# of an allreduce of 8 B and 8 KiB made three ways in the same process: the blocking
# MPI_Allreduce, MPI_Iallreduce + MPI_Wait, and MPI_Start + MPI_Wait of a persistent one
# on the same buffers (tests/fake/persistent.cpp, PERSIST_BENCH; medians and 90th
# percentiles of N calls each, no barrier before a timed call), per configuration: host
# buffers (the MPI's own persistent request; route ht forced), GPU buffers classic (no
# stream) and stream-ordered (routes ht and nccl). Against the fake CUDA driver and NCCL of
# tests/fake (FAKE_CUDA_DIR= empty to use the installed driver on a GPU node). Then the
# pass-through price on host buffers without a CUDA driver: scripts/bench-passthrough.sh
# with --coll persistent (MPI_Start + MPI_Wait through streamcoll against PMPI_Start +
# PMPI_Wait of the MPI's own request).
#   scripts/bench-persistent.sh [NP] [N]     (default 2 ranks, 2000 calls per form)
# BUILD_DIR: the build folder (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
n=${2:-2000}
build=${BUILD_DIR:-build}
fake=${FAKE_CUDA_DIR-$PWD/$build/tests/fake/cuda}
ninja -C "$build" tests/fake/fake_persistent bench/passthrough_latency >/dev/null
mpi=(mpirun -np)
openmpi=0
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  openmpi=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  [ "$(id -u)" -eq 0 ] && mpi=(mpirun --allow-run-as-root -np)
fi
run() {  # MODE ENV...
  local mode=$1
  shift
  local env=("$@" PERSIST_BENCH=1 PERSIST_STARTS="$n" LD_PRELOAD="$PWD/$build/libstreamcoll.so")
  if [ -n "$fake" ]; then
    env+=(LD_LIBRARY_PATH="$PWD/$build/tests/fake:$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
          STREAMCOLL_NCCL_LIB="$PWD/$build/tests/fake/libfakenccl.so" FAKE_CUDA_BUS_ID=per-rank)
  fi
  if [ $openmpi = 1 ]; then
    local xs=()
    for e in "${env[@]}"; do xs+=(-x "$e"); done
    "${mpi[@]}" "$np" "${xs[@]}" "$build/tests/fake/fake_persistent" "$mode" | grep '^bench'
  else
    env "${env[@]}" "${mpi[@]}" "$np" "$build/tests/fake/fake_persistent" "$mode" | grep '^bench'
  fi
}
echo "== host buffers, default table (the MPI's own persistent request)"
run host
echo "== host buffers, route ht"
run host STREAMCOLL_ROUTE='*:ht' STREAMCOLL_THREAD_MULTIPLE=1
echo "== GPU buffers, classic (no stream), default table"
run device
echo "== GPU buffers, classic, route ht"
run device STREAMCOLL_ROUTE='*:ht' STREAMCOLL_THREAD_MULTIPLE=1
echo "== GPU buffers on a stream, route ht"
run stream STREAMCOLL_ROUTE='*:ht' STREAMCOLL_THREAD_MULTIPLE=1
echo "== GPU buffers on a stream, route nccl (STREAMCOLL_NCCL_NONBLOCKING=1)"
run stream STREAMCOLL_ROUTE='allreduce:nccl' STREAMCOLL_NCCL_NONBLOCKING=1
echo "== pass-through price, host buffers, no CUDA driver"
BUILD_DIR=$build scripts/bench-passthrough.sh 5 --coll persistent --max 64K
