#!/usr/bin/env bash
# Environment knobs, seen from outside: statistics table, STREAMCOLL_DISABLE, a bad
# tuning file (file:line and the reason, then the run goes on with the default table), a
# bad STREAMCOLL_ROUTE, debug lines tagged with the rank.
#   behaviour.sh LIBSTREAMCOLL DEMO_PROGRAM
set -uo pipefail
lib=$1 demo=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }
run() {  # run NP PROGRAM ARGS... with LD_PRELOAD; output in $tmp/out, $tmp/err
  local np=$1; shift
  env LD_PRELOAD="$lib" "${extra[@]}" "$here/run.sh" plain "$np" "$@" >"$tmp/out" 2>"$tmp/err"
}

# 1. The statistics table: every collective of the demo, summed over 3 ranks.
extra=(STREAMCOLL_STATS=1)
if run 3 "$demo" && grep -q "all results verified" "$tmp/out"; then ok "demo passes under the shim"; else fail "demo under the shim"; cat "$tmp/out" "$tmp/err"; fi
for c in allreduce bcast reduce_scatter_block allgather alltoall iallreduce barrier; do
  # 3 ranks x 20 iterations (allgather twice per iteration), plus the demo's final allreduce.
  case $c in allgather) want=120;; allreduce) want=63;; *) want=60;; esac
  if grep -Eq "^$c +pmpi +host +$want " "$tmp/err"; then ok "stats: $c counted $want times"; else fail "stats: $c not counted $want times"; fi
done

# 2. STREAMCOLL_DISABLE=1: no table, program unaffected.
extra=(STREAMCOLL_STATS=1 STREAMCOLL_DISABLE=1)
if run 2 "$demo" && ! grep -q "streamcoll statistics" "$tmp/err"; then ok "disable: no statistics"; else fail "disable"; cat "$tmp/err"; fi

# 3. A malformed tuning file is reported with file:line and the reason; the run goes on.
printf '# comment\nallreduce * * * * device * nccl\nbcast 1K-2 * * * * * pmpi\n' >"$tmp/bad.conf"
extra=(STREAMCOLL_TUNING_FILE="$tmp/bad.conf" STREAMCOLL_STATS=1)
if run 2 "$demo" && grep -q "all results verified" "$tmp/out"; then ok "bad tuning file: run goes on"; else fail "bad tuning file: run failed"; fi
if grep -q "$tmp/bad.conf:3: bad bytes range '1K-2'.*using the default table" "$tmp/err"; then ok "bad tuning file: file:line and reason"; else fail "bad tuning file message"; cat "$tmp/err"; fi

# 4. A good tuning file loads (info line names it) and is used.
printf 'allreduce * * * * * * pmpi\n' >"$tmp/good.conf"
extra=(STREAMCOLL_TUNING_FILE="$tmp/good.conf" STREAMCOLL_DEBUG=info)
if run 2 "$demo" && grep -q "^\[streamcoll 1\] info: tuning table $tmp/good.conf: 1 rules" "$tmp/err"; then ok "good tuning file loaded, rank-tagged info line"; else fail "good tuning file"; cat "$tmp/err"; fi

# 5. A bad STREAMCOLL_ROUTE is reported and ignored.
extra=(STREAMCOLL_ROUTE="allreduce:warp")
if run 2 "$demo" && grep -q "STREAMCOLL_ROUTE: 'allreduce:warp': unknown route 'warp'" "$tmp/err"; then ok "bad STREAMCOLL_ROUTE reported"; else fail "bad STREAMCOLL_ROUTE"; cat "$tmp/err"; fi

# 6. STREAMCOLL_ROUTE forcing a route this build lacks, or one that declines the call,
# falls back to pmpi, with a trace line. ccube and nccl are in builds with NCCL (ccube
# with the kernels too) and take device memory only; the demo's buffers are on the host.
extra=(STREAMCOLL_ROUTE="allreduce:ccube,bcast:nccl" STREAMCOLL_DEBUG=trace STREAMCOLL_STATS=1)
if run 2 "$demo" && grep -q "all results verified" "$tmp/out" && grep -Eq "route ccube \(STREAMCOLL_ROUTE\) (declines this call|is not available); using pmpi" "$tmp/err" && grep -Eq "route nccl \(STREAMCOLL_ROUTE\) (declines this call|is not available); using pmpi" "$tmp/err" && grep -Eq "^allreduce +pmpi +host" "$tmp/err"; then ok "forced unavailable or declining route falls back to pmpi"; else fail "forced unavailable or declining route"; cat "$tmp/err" | tail -20; fi

# 7. STREAMCOLL_CHECK=1 on a correct program: no complaint, same results.
extra=(STREAMCOLL_CHECK=1)
if run 4 "$demo" --count 1000 && grep -q "all results verified" "$tmp/out" && ! grep -q "STREAMCOLL_CHECK" "$tmp/err"; then ok "check mode: correct program passes"; else fail "check mode"; cat "$tmp/err"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
