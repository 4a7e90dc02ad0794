#!/usr/bin/env bash
# A table rule whose route declines a call hands it to the next matching rule; a forced
# route (STREAMCOLL_ROUTE) that declines sends it to pmpi. sc_bench (2 ranks, host
# allreduce, nothing forced on the communicator) reports the route every size took.
#   fallthrough.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }
source "$(dirname "$0")/../../scripts/mpi-launcher.sh"
mpi_launcher "$(mpi_flavor_of "$build")"
mpi_args=("${mpirun_args[@]}" -np 2)
[ "$mpirun_kind" = openmpi ] && export OMPI_MCA_mpi_yield_when_idle=1
# 3x3 needs 9 ranks: blueconnect declines every call of a 2-rank communicator.
cat >"$out/table.txt" <<'TABLE'
allreduce  0-1K  *  *  *  host  *  blueconnect  hierarchy=3x3
allreduce  *     *  *  *  host  *  ht           algo=ring
allreduce  *     *  *  *  host  *  pmpi
TABLE
# taken CSV: the "taken" column of sc_bench's rows, one per size
run() {
  local csv=$1
  shift
  env LD_PRELOAD="$build/libstreamcoll.so" STREAMCOLL_STATS=1 "$@" \
    timeout 300 "$mpirun" "${mpi_args[@]}" "$build/bench/sc_bench" --coll allreduce -e 4K -n 5 \
    --route table --csv "$csv" --quiet >"$csv.out" 2>&1 || { cat "$csv.out"; fail "sc_bench failed"; }
  cut -d, -f11 "$csv" | tail -n +2 | sort | uniq -c | tr -s ' '
}
got=$(run "$out/table.csv" STREAMCOLL_TUNING_FILE="$out/table.txt")
[ "$got" = " 11 ht" ] || fail "with the table, expected every size on ht (rule 1 declines, rule 2 takes it), got: $got"
echo "table rule declines -> next rule: $got"
got=$(run "$out/forced.csv" STREAMCOLL_TUNING_FILE="$out/table.txt" \
      STREAMCOLL_ROUTE=allreduce:blueconnect:hierarchy=3x3)
[ "$got" = " 11 pmpi" ] || fail "with STREAMCOLL_ROUTE, expected every size on pmpi, got: $got"
echo "forced route declines -> pmpi: $got"
echo "PASS: fall-through"
