#!/usr/bin/env bash
# Runs a job that must abort: passes when it exits non-zero (not by timeout), a line of its
# output matches PATTERN (the reason streamcoll gives), and no line says "FAIL:" (a check
# of the program failed first: a wrong value, or a call that returned where the job had to
# end). For failures that streamcoll answers with MPI_Abort, where a should_fail test would
# pass on any crash.
#   expect_abort.sh PATTERN COMMAND [ARGS ...]
set -uo pipefail
pattern=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then
  echo "expect_abort: the job exited 0; it had to abort"
  exit 1
fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "expect_abort: the job timed out (exit $rc)"
  exit 1
fi
if ! grep -q -- "$pattern" <<<"$out"; then
  echo "expect_abort: no line matches '$pattern' (exit $rc)"
  exit 1
fi
if grep -q "FAIL:" <<<"$out"; then
  echo "expect_abort: a check failed before the abort"
  exit 1
fi
echo "expect_abort: aborted as expected (exit $rc)"
