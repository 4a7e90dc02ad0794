#!/usr/bin/env bash
# Configures (once) and builds streamcoll into ./build (or $BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release "$@"
ninja -C "$build"
