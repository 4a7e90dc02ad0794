#!/usr/bin/env bash
# The whole test suite: unit tests and real mpirun runs (1-4 ranks, LD_PRELOAD and linked,
# C and Fortran), then the suite under MPICH (1-2 ranks, some at 3-4). Ends with summary
# lines "tests: N passed, N failed, N skipped" (and "mpich: ..."). Suite 'long' (a few
# tests at more ranks) runs with STREAMCOLL_TEST_LONG=1.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
scripts/build.sh
rc=0
# Suite 'long' (more rank counts of tests that run at fewer in the rest) only when asked:
# STREAMCOLL_TEST_LONG=1, or tests named.
long=(--no-suite long)
if [ $# -gt 0 ] || [ "${STREAMCOLL_TEST_LONG:-0}" = 1 ]; then long=(); fi
meson test -C "$build" --print-errorlogs "${long[@]}" "$@" || rc=$?
log="$build/meson-logs/testlog.json"
if [ -f "$log" ]; then
  count() { grep -c "\"result\": \"$1\"" "$log" || true; }
  echo "tests: $(count OK) passed, $(( $(count FAIL) + $(count TIMEOUT) + $(count ERROR) )) failed, $(count SKIP) skipped"
fi
# The second MPI: MPICH (scripts/test-mpich.sh), unless tests were named or
# STREAMCOLL_TEST_MPICH=0.
if [ $# -eq 0 ] && [ "${STREAMCOLL_TEST_MPICH:-1}" != 0 ]; then
  scripts/test-mpich.sh || rc=1
fi
exit $rc
