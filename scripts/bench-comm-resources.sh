#!/usr/bin/env bash
# What streamcoll's NCCL communicators take in a program that makes many communicators
# (bench/comm_resources): GPU memory against the number of communicators (MPI_Comm_dup:
# children split from world's NCCL communicator, sharing its resources; MPI_Comm_idup: each
# its own), the set-up time of the first and the K-th, and the price of MPI_Comm_dup +
# MPI_Comm_free through streamcoll against PMPI_, with and without an NCCL parent.
#   scripts/bench-comm-resources.sh [RUNS]
# Under the fake CUDA driver and fake NCCL of tests/fake by default (their memory model:
# FAKE_NCCL_COMM_BYTES, or 512 MiB + 16 channels x ring peers x 9.6 MB per communicator
# with resources of its own; FAKE_CUDA_MEM_TOTAL, 80 GiB); on a GPU node set FAKE_CUDA_DIR=
# and STREAMCOLL_NCCL_LIB= empty to use the real driver and NCCL. SC_BENCH_NP: rank counts
# (default "2 4"); SC_BENCH_ARGS: comm_resources options (default --comms 40 --reps 200).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
build=${BUILD_DIR:-build}
fake=${FAKE_CUDA_DIR-$PWD/$build/tests/fake/cuda}
nccl=${STREAMCOLL_NCCL_LIB-$PWD/$build/tests/fake/libfakenccl.so}
read -r -a args <<< "${SC_BENCH_ARGS:---comms 40 --reps 200}"
mpi=(mpirun -np)
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  [ "$(id -u)" -eq 0 ] && mpi=(mpirun --allow-run-as-root -np)
fi
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null); $(nproc) cores; runs $runs; ${args[*]}"
env_=(LD_PRELOAD="$PWD/$build/libstreamcoll.so")
[ -n "$fake" ] && env_+=(LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                          FAKE_CUDA_BUS_ID=per-rank)
[ -n "$nccl" ] && env_+=(STREAMCOLL_NCCL_LIB="$nccl")
for np in ${SC_BENCH_NP:-2 4}; do
  for i in $(seq 1 "$runs"); do
    echo "## $np ranks, run $i"
    env "${env_[@]}" "${mpi[@]}" "$np" "$build/bench/comm_resources" "${args[@]}"
  done
done
