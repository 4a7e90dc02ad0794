#!/usr/bin/env bash
# The whole test suite: unit tests and real mpirun runs (1-4 ranks, LD_PRELOAD and linked).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
meson test -C "${BUILD_DIR:-build}" --print-errorlogs "$@"
