#!/usr/bin/env bash
# STREAMCOLL_DRIVER_PROFILE=1 on a program that drives the fake CUDA driver through
# streamcoll (tests/fake/fusion_device.cpp): the program must still pass (every driver
# call goes through a timing wrapper), and every rank must print its profile at
# MPI_Finalize: a header, rows of "entry point, calls, total us, mean us" whose calls and
# totals add up to the "(all)" row, cuInit called exactly once (the driver is loaded once
# per process), and the staging's cuMemcpyAsync there. Without the variable, no profile.
#   driver_profile.sh RUN_SH NP PROGRAM [ARGS...]
set -uo pipefail
run_sh=$1 np=$2
shift 2
fail() { echo "FAIL: $*"; exit 1; }
out=$(STREAMCOLL_DRIVER_PROFILE=1 "$run_sh" preload "$np" "$@" 2>&1)
rc=$?
echo "$out" | grep -E "passed|driver profile|^cu|^\(all\)" | head -80
[ $rc -eq 0 ] || { echo "$out" | tail -30; fail "the program failed under STREAMCOLL_DRIVER_PROFILE=1 (exit $rc)"; }
for ((r = 0; r < np; ++r)); do
  rows=$(echo "$out" | awk -v h="streamcoll driver profile (rank $r)" '
    $0 == h {on = 1; next}
    on && /^driver entry point/ {next}
    on && /^\(all\)/ {print; exit}
    on {print}')
  [ -n "$rows" ] || fail "rank $r printed no driver profile"
  echo "$rows" | awk -v r="$r" '
    /^\(all\)/ {all_calls = $2; all_us = $3; next}
    NF != 4 || $2 !~ /^[0-9]+$/ || $2 == 0 {print "FAIL: rank " r ": malformed row: " $0; bad = 1}
    {calls += $2; us += $3; n[$1] = $2; d = $4 * $2 - $3; if (d < 0) d = -d; if (d > 0.051 + 0.0005 * $2) {print "FAIL: rank " r ": mean of " $1 " times its calls is not its total"; bad = 1}}
    END {
      if (all_calls != calls) {print "FAIL: rank " r ": (all) has " all_calls " calls, the rows " calls; bad = 1}
      if (all_us - us > 1 || us - all_us > 1) {print "FAIL: rank " r ": (all) has " all_us " us, the rows " us; bad = 1}
      if (n["cuInit"] != 1) {print "FAIL: rank " r ": cuInit called " n["cuInit"] + 0 " times, not once"; bad = 1}
      if (n["cuMemcpyAsync"] + 0 == 0) {print "FAIL: rank " r ": no cuMemcpyAsync (the staging copies)"; bad = 1}
      exit bad
    }' || exit 1
done
plain=$("$run_sh" preload "$np" "$@" 2>&1) || fail "the program failed without the profile"
echo "$plain" | grep -q "driver profile" && fail "a profile was printed without STREAMCOLL_DRIVER_PROFILE"
echo "driver_profile: $np ranks, every rank's profile consistent"
exit 0
