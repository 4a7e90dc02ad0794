#!/usr/bin/env bash
# streamcoll and another PMPI tool preloaded together (counter_tool.c), in both orders:
# every call is seen by both and every result is right (stack_app.c checks). A tool that
# chains (its MPI_X calls the next MPI_X) works before or after streamcoll; a classic PMPI
# tool (it calls PMPI_X) works after streamcoll, and before it bypasses it (streamcoll
# defines no PMPI_ names: docs/guide.md, "Stacking with other PMPI tools"), which the last case
# records.
#   stacking.sh LIBSTREAMCOLL LIBCOUNTER STACK_APP
set -euo pipefail
sc=$1 tool=$2 app=$3
fail=0
run() {  # ORDER CHAIN EXPECT
  local preload=$1 chain=$2 expect=$3
  echo "== LD_PRELOAD=$preload COUNTER_CHAIN=$chain (expect: $expect)"
  COUNTER_CHAIN=$chain STREAMCOLL_STATS=1 LD_PRELOAD="$preload" \
    "$(dirname "$0")/../mpi/run.sh" plain 2 "$app" "$expect" || fail=1
}
run "$sc:$tool" 1 both
run "$tool:$sc" 1 both
run "$sc:$tool" 0 both
run "$tool:$sc" 0 tool
[ $fail = 0 ] && echo "stacking: 4 passed, 0 failed" || { echo "stacking: some orders failed"; exit 1; }
