#!/usr/bin/env bash
# Stream-ordered vs classic MPI_Allreduce on GPU buffers: runs bench/stream_latency under
# mpirun with streamcoll preloaded and STREAMCOLL_STATS=1 (for the route column), NP
# ranks (default 1). Writes no file; keep a result with e.g. (stderr has streamcoll's
# statistics table, printed at MPI_Finalize)
#   scripts/bench-stream.sh 1 2>&1 | tee bench/results/stream_latency_1rank_h200.txt
# Baseline through the real MPI call (the attached stream is then synchronised before
# each call, inside streamcoll):
#   STREAMCOLL_ROUTE=allreduce:pmpi scripts/bench-stream.sh
# Without a GPU the benchmark prints one SKIP line and exits 0.
#   scripts/bench-stream.sh [NP] [benchmark options: --min-bytes 8 --max-bytes 64M
#                                 --factor 4 --iters 1000 --warmup 100 --batch 100 --single 50]
set -euo pipefail
cd "$(dirname "$0")/.."
echo "# scripts/bench-stream.sh $*"
np=${1:-1}
shift || true
scripts/build.sh >/dev/null
build=${BUILD_DIR:-build}
case $build in /*) lib=$build/libstreamcoll.so ;; *) lib=$PWD/$build/libstreamcoll.so ;; esac
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
mpi_args=("${mpirun_args[@]}" -np "$np")
echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'); $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "# $mpirun ${mpi_args[*]} $build/bench/stream_latency $*"
# Variables reach the local ranks through mpirun's own environment.
LD_PRELOAD="$lib" STREAMCOLL_STATS=1 \
  "$mpirun" "${mpi_args[@]}" "$build/bench/stream_latency" "$@"
