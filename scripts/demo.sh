#!/usr/bin/env bash
# The main job: install what is needed, build the library and the demo (nothing else), and
# run the demo training step (examples/demo.cpp: allreduce, bcast, reduce_scatter_block,
# allgather, alltoall, iallreduce per step, every result checked) under mpirun -np 4, side
# by side:
#   mpi          the MPI alone (no streamcoll)
#   streamcoll   streamcoll preloaded, its default table (GPU buffers to NCCL when a GPU is
#                present; host buffers pass through), with the statistics table
#   ht           streamcoll's host-transfer route forced for the reductions, bcast and
#                allgather (STREAMCOLL_ROUTE; schedules on the MPI's point-to-point calls)
#   blueconnect  streamcoll's hierarchical allreduce forced, the 4 ranks as 2 groups of 2
#                (reduce-scatter in the groups, allreduce across, allgather back)
# then a table of the time per step and whether every result was right. Device buffers
# when a GPU is present, host buffers otherwise.
#   scripts/demo.sh [demo options, e.g. --iters 50 --count 1048576, or --stream]
# NP: ranks (default 4; the blueconnect run needs an even count). DEMO_RUNS: the runs to
# make (default "mpi streamcoll ht blueconnect").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release
meson compile -C "$build" streamcoll demo >/dev/null
case $build in /*) lib=$build/libstreamcoll.so ;; *) lib=$PWD/$build/libstreamcoll.so ;; esac
np=${NP:-4}
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
host_routes='allreduce:ht,bcast:ht,allgather:ht,reduce_scatter_block:ht'
half=$((np / 2))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for run in ${DEMO_RUNS:-mpi streamcoll ht blueconnect}; do
  envs=()
  case $run in
    mpi) ;;
    streamcoll) envs=(LD_PRELOAD="$lib" STREAMCOLL_STATS=1) ;;
    ht) envs=(LD_PRELOAD="$lib" STREAMCOLL_STATS=1 STREAMCOLL_THREAD_MULTIPLE=1
              STREAMCOLL_ROUTE="$host_routes") ;;
    blueconnect) envs=(LD_PRELOAD="$lib" STREAMCOLL_STATS=1
                       STREAMCOLL_ROUTE="allreduce:blueconnect:hierarchy=${half}x2:backend=sched/mpi") ;;
    *) echo "demo.sh: unknown run '$run'" >&2; exit 2 ;;
  esac
  echo "=== $run"
  if env "${envs[@]}" "$mpirun" "${mpirun_args[@]}" -np "$np" "$build/examples/demo" "$@" \
      2>&1 | tee "$out/$run.txt"; then :; else status=1; fi
done
echo "=== side by side ($np ranks; time of the whole run on rank 0, checks included)"
printf '%-12s %12s  %s\n' run "ms" results
for run in ${DEMO_RUNS:-mpi streamcoll ht blueconnect}; do
  f=$out/$run.txt
  ms=$(sed -n 's/^demo: [0-9]* steps in \([0-9.]*\) ms.*/\1/p' "$f" | head -1)
  if grep -q "^demo: all results verified" "$f"; then verdict="all verified"; else
    verdict="NOT VERIFIED"; status=1; fi
  # The route the run's allreduce took (streamcoll's statistics), where it has them.
  route=$(awk '$1 == "allreduce" && $2 != "route" {print $2; exit}' "$f")
  printf '%-12s %12s  %s%s\n' "$run" "${ms:-?}" "$verdict" "${route:+ (allreduce on $route)}"
done
exit $status
