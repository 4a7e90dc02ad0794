#!/usr/bin/env bash
# The whole test suite: unit tests and real mpirun runs (1-4 ranks, LD_PRELOAD and linked,
# C and Fortran). Ends with one summary line "N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
scripts/build.sh
rc=0
meson test -C "$build" --print-errorlogs "$@" || rc=$?
log="$build/meson-logs/testlog.json"
if [ -f "$log" ]; then
  count() { grep -c "\"result\": \"$1\"" "$log" || true; }
  echo "tests: $(count OK) passed, $(( $(count FAIL) + $(count TIMEOUT) + $(count ERROR) )) failed, $(count SKIP) skipped"
fi
exit $rc
