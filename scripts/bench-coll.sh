#!/usr/bin/env bash
# One collective over a sweep of sizes on the routes asked for (bench/sc_bench.cpp, whose
# top comment documents every option): builds (scripts/build.sh), then runs sc_bench on NP
# ranks under mpirun with streamcoll preloaded and STREAMCOLL_STATS=1 (the route each
# row's calls took is in its "taken" column). Every result is checked.
#   scripts/bench-coll.sh NP [sc_bench options]
# for example
#   scripts/bench-coll.sh 4 --coll allreduce -e 1M --route pmpi --route ht:algo=rd \
#       --route blueconnect:hierarchy=2x2:backend=sched --csv allreduce_np4.csv
#   scripts/bench-coll.sh 8 --mem device --stream --route nccl --route ht:algo=rd --json out.json
# The launcher is the build's MPI's (scripts/mpi-launcher.sh): with Open MPI the ranks may
# outnumber the cores (--oversubscribe --bind-to none, OMPI_MCA_mpi_yield_when_idle=1);
# LD_PRELOAD, STREAMCOLL_* and NCCL_* are passed to every node (-x, or Hydra's -genvall). BUILD_DIR (default build) picks the build. The output is the
# record: keep it with e.g. `scripts/bench-coll.sh 4 ... 2>&1 | tee result.txt`.
# Exit status: sc_bench's (0; 1 a wrong result; 2 a bad option; 77 --mem device without
# a usable GPU: "SKIP: ...").
set -euo pipefail
cd "$(dirname "$0")/.."
echo "# scripts/bench-coll.sh $*"
np=${1:-}
case $np in
  '' | *[!0-9]* | 0)
    echo "usage: scripts/bench-coll.sh NP [sc_bench options] (NP: number of ranks, got '$np')" >&2
    exit 2
    ;;
esac
shift
scripts/build.sh >/dev/null
build=${BUILD_DIR:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
lib=$build/libstreamcoll.so
export LD_PRELOAD=$lib STREAMCOLL_STATS=1
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
[ "$mpirun_kind" = openmpi ] && export OMPI_MCA_mpi_yield_when_idle=1
mpi_pass $(compgen -e | grep -E '^(LD_PRELOAD|STREAMCOLL_|NCCL_)' || true)
mpi_args=("${mpirun_args[@]}" "${mpirun_pass[@]}" -np "$np")
echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'); $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "# LD_PRELOAD=$lib STREAMCOLL_STATS=1 $mpirun ${mpi_args[*]} $build/bench/sc_bench $*"
rc=0
"$mpirun" "${mpi_args[@]}" "$build/bench/sc_bench" "$@" || rc=$?
exit $rc
