#!/usr/bin/env bash
# The autotuner end to end on host routes with 2 ranks (CI): scripts/autotune.sh measures
# pmpi and the three ht algorithms for allreduce, reduce_scatter_block and allgather from
# 4 B to 64 KiB, writes the table, plots it, runs sc_bench again with nothing forced under
# STREAMCOLL_TUNING_FILE=table and checks (sc_tune check) that every size took the route
# the table names and that the table routes every measured point to its winner.
# Then the check itself must fail on a table that routes otherwise.
#   autotune_smoke.sh BUILD_DIR OUT_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 out=$2
rm -rf "$out"
colls="allreduce reduce_scatter_block allgather"
BUILD_DIR=$build "$src/scripts/autotune.sh" --no-build --np 2 --coll "${colls// /,}" \
  --max-bytes 64K --iters 20 --warmup 2 --out "$out"

fail() { echo "FAIL: $*"; exit 1; }
for c in $colls; do
  grep -Eq "^$c +[^ ]+ +2- +1 +\* +host +no +(pmpi|ht algo=(rd|rabenseifner|ring))\$" \
    "$out/table.txt" || fail "no measured $c rule for 2 ranks in $out/table.txt"
done
grep -q "^# fallback" "$out/table.txt" || fail "the table has no fallback"
for c in $colls; do
  [ "$(grep -c "^$c,.*,table,table," "$out/verify.csv")" -ge 10 ] ||
    fail "verify.csv has too few table-routed $c rows"
done
have_mpl=0
for p in python3 /usr/bin/python3; do "$p" -c 'import matplotlib' 2>/dev/null && have_mpl=1; done
if [ $have_mpl = 1 ]; then
  for c in $colls; do
    for kind in map latency; do
      f=$out/autotune-$kind-$c-host-nostream-singlenode.png
      [ -s "$f" ] && [ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
        fail "$f is missing or not a PNG"
    done
  done
else
  echo "note: no matplotlib, plots not checked"
fi

# The check must catch a table that is not obeyed: every measured rule turned into
# another route (pmpi <-> ht algo=ring, ht algo=rd|rabenseifner -> pmpi).
sed -E -e '/^# fallback/,$b' -e 's/ pmpi$/ PLACEHOLDER/; s/ ht algo=(rd|rabenseifner|ring)$/ pmpi/; s/ PLACEHOLDER$/ ht algo=ring/' \
  "$out/table.txt" >"$out/swapped.txt"
! cmp -s "$out/table.txt" "$out/swapped.txt" || fail "the swapped table equals the table"
if "$build/bench/sc_tune" check --table "$out/swapped.txt" --measured "$out/measured.csv" \
    >"$out/swapped-check.txt"; then
  fail "sc_tune check accepted a table that routes measured points elsewhere"
fi
if "$build/bench/sc_tune" check --table "$out/swapped.txt" "$out/verify.csv" \
    >>"$out/swapped-check.txt"; then
  fail "sc_tune check accepted calls that did not take the table's routes"
fi
echo "the check rejects a swapped table: $(grep -c '^FAIL' "$out/swapped-check.txt") mismatches"
echo "PASS: autotune smoke"
