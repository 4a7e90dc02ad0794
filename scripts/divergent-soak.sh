#!/usr/bin/env bash
# More seeds of tests/fake/divergent.cpp's random programs than CI runs: ranks that differ
# in memory kinds and completion calls, against the fake CUDA driver and fake NCCL.
#   scripts/divergent-soak.sh [SEEDS] [FIRST_SEED]   (default 50 seeds from 1000)
# Runs 2, 3 and 4 ranks, with routes from the default table (nccl) and with route ht
# forced; each run bounded by a watchdog. Prints one line per run and exits nonzero if any
# failed (reproduce one with DIVERGENT_SEED_BASE=<seed> and SEEDS=1).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-50}
first=${2:-1000}
scripts/build.sh >/dev/null
b=$PWD/${BUILD_DIR:-build}
[ -x "$b/tests/fake/fake_divergent" ] || { echo "no fake tests in this build (CUDA/NCCL headers?)" >&2; exit 77; }
ht='allreduce:ht:algo=ring,reduce:ht:algo=rd,bcast:ht:algo=rabenseifner,allgather:ht:algo=mpi,reduce_scatter_block:ht:algo=rabenseifner'
export STREAMCOLL_LIB=$b/libstreamcoll.so FAKE_CUDA_BUS_ID=per-rank FAKE_CUDA_DEFER=1 \
       LD_LIBRARY_PATH=$b/tests/fake/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
       DIVERGENT_TIMEOUT=$((30 + seeds * 5)) FAKE_NCCL_TIMEOUT_S=60
failed=0
for np in 2 3 4; do
  for routes in nccl ht; do
    if [ "$routes" = nccl ]; then
      env=(STREAMCOLL_NCCL_LIB="$b/tests/fake/libfakenccl.so")
    else
      env=(STREAMCOLL_NCCL_LIB=/nonexistent/libnccl.so.2 STREAMCOLL_ROUTE="$ht")
    fi
    if out=$(env "${env[@]}" DIVERGENT_SEED_BASE="$first" tests/mpi/run.sh preload "$np" \
               "$b/tests/fake/fake_divergent" random "$seeds" 2>&1); then
      echo "np $np, $routes: $(echo "$out" | grep -E 'passed' | tail -1)"
    else
      failed=1
      echo "np $np, $routes: FAILED"
      echo "$out" | grep -E 'FAIL|watchdog|fake NCCL' | head -20
    fi
  done
done
exit $failed
