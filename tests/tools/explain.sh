#!/usr/bin/env bash
# streamcoll-info --explain against real runs: for the embedded table, a forced route
# (STREAMCOLL_ROUTE) and a tuning file (a rule that matches the call and one that does
# not), the route --explain answers for "allreduce 8 host 2 ranks" is the route the same
# call takes in a 2-rank run (examples/allreduce.c, one MPI_LONG, streamcoll's
# statistics), and what STREAMCOLL_DEBUG=info's one line for that call says it took. And a
# call that does not parse exits 2.
#   explain.sh BUILD_DIR SOURCE_DIR      (STREAMCOLL_LIB: the library)
set -euo pipefail
build=$1 src=$2
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/scripts/mpi-launcher.sh"
flavor=$(mpi_flavor_of "$(dirname "$STREAMCOLL_LIB")")
mpi_launcher "$flavor"
# The compiler wrapper of the MPI the library is for (Debian: mpicc.openmpi, mpicc.mpich).
case $flavor in openmpi | mpich) mpicc=mpicc.$flavor ;; *) mpicc=mpicc ;; esac
command -v "$mpicc" >/dev/null || mpicc=mpicc
"$mpicc" "$src/examples/allreduce.c" -o "$tmp/allreduce" || fail "$mpicc"
printf 'allreduce 0-64 * * * host * ht algo=rd\n' >"$tmp/ht.table"
printf 'allreduce 16- * * * host * ht\n' >"$tmp/big.table"
checked=0
# Each case: the environment (VAR=VALUE ... or -), the route expected.
while read -r envs want; do
  [ "$envs" = - ] && envs=""
  # shellcheck disable=SC2086
  said=$(env $envs STREAMCOLL_THREAD_MULTIPLE=1 "$build/tools/streamcoll-info" \
           --explain "allreduce 8 host 2 ranks" | sed -n 's/^-> \([a-z]*\).*/\1/p')
  # shellcheck disable=SC2086
  env $envs STREAMCOLL_THREAD_MULTIPLE=1 STREAMCOLL_STATS=1 STREAMCOLL_DEBUG=info LD_PRELOAD="$STREAMCOLL_LIB" \
    timeout 120 "$mpirun" "${mpirun_args[@]}" -np 2 "$tmp/allreduce" </dev/null >"$tmp/run.log" 2>&1 ||
    { cat "$tmp/run.log"; fail "the run with $envs"; }
  took=$(awk '$1 == "allreduce" && $3 ~ /^(host|pinned|device|managed|mixed)$/ {print $2; exit}' "$tmp/run.log")
  told=$(sed -n 's/^\[streamcoll 0\] info: allreduce of 8 B on host memory, 2 ranks: \([a-z]*\) (.*/\1/p' "$tmp/run.log" | head -1)
  echo "${envs:-(embedded table)}: --explain says $said, the run took $took, its info line says $told (expected $want)"
  [ "$said" = "$want" ] && [ "$took" = "$want" ] && [ "$told" = "$want" ] || fail "$envs"
  checked=$((checked + 1))
done <<CASES
- pmpi
STREAMCOLL_ROUTE=allreduce:ht ht
STREAMCOLL_ROUTE=bcast:ht pmpi
STREAMCOLL_TUNING_FILE=$tmp/ht.table ht
STREAMCOLL_TUNING_FILE=$tmp/big.table pmpi
CASES
if "$build/tools/streamcoll-info" --explain "allreduce 8 nowhere" >/dev/null 2>&1; then
  fail "a call that does not parse was answered"
fi
echo "explain: $checked passed, 0 failed"
