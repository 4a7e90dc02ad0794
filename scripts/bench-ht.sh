#!/usr/bin/env bash
# Route ht (host transfer) on a GPU node: runs bench/ht_latency under mpirun with
# streamcoll preloaded and STREAMCOLL_STATS=1 (the routes each column took are checked),
# NP ranks (1 or 2; default 1). One run gives, per size from 4 B to 1 MiB: the D2H and H2D
# copy latencies, the host PMPI_Allreduce on pinned memory, the hand-written baseline
# (sync, D2H, PMPI_Allreduce, H2D), nccl, and ht with each host algorithm (rd,
# rabenseifner, ring, mpi) with and without a stream attached, plus the ratios of the
# goals (ht <= 1.3 x the parts; ht faster than the baseline up to 64 KiB) and the host
# time of the stream-attached call.
#   scripts/bench-ht.sh [NP] [ht_latency options: --min-count 1 --max-count 262144
#                              --iters 200 --warmup 20]
# With 2 ranks on a node with one GPU both ranks use it: NCCL refuses that, the nccl
# column then shows "-" and a note says so (ht does not care).
# The output is the record: keep it with e.g.
#   scripts/bench-ht.sh 1 2>&1 | tee bench/results/ht_latency_1rank_h200.txt
# Without a GPU it prints "SKIP: no usable GPU (...)" and exits 77.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "# scripts/bench-ht.sh $*"
np=${1:-1}
shift || true
case $np in 1|2) ;; *) echo "bench-ht.sh: NP must be 1 or 2 (got '$np')" >&2; exit 2 ;; esac
scripts/build.sh >/dev/null
build=${BUILD_DIR:-build}
case $build in /*) lib=$build/libstreamcoll.so ;; *) lib=$PWD/$build/libstreamcoll.so ;; esac
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
mpi_args=("${mpirun_args[@]}" -np "$np")
echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'); $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "# $mpirun ${mpi_args[*]} $build/bench/ht_latency $*"
rc=0
LD_PRELOAD="$lib" STREAMCOLL_STATS=1 \
  "$mpirun" "${mpi_args[@]}" "$build/bench/ht_latency" "$@" || rc=$?
exit $rc
