#!/usr/bin/env bash
# The suite's reduced set under MPICH (Debian's mpich and libmpich-dev), in a second build
# folder (build-mpich: -Dmpi=mpich, no nvgroup kernels), run with mpiexec.mpich: the MPI
# semantics, bad input, the stream attribute, thread levels, a host route, PMPI tool
# stacking, Fortran mpif.h, and some GPU-route tests against the fake driver, at one to
# four ranks. What is left out and why: README, "MPICH". Ends with
# "mpich: N passed, N failed, N skipped". Without MPICH installed it says so and exits 0.
#   scripts/test-mpich.sh [TEST NAME ...]   (default: the set below)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MPICH_BUILD_DIR:-build-mpich}
if ! command -v mpiexec.mpich >/dev/null 2>&1 || ! pkg-config --exists mpich; then
  echo "mpich: not installed (apt-get install mpich libmpich-dev): skipped"
  exit 0
fi
[ -f "$build/build.ninja" ] ||
  meson setup "$build" --buildtype=release -Dmpi=mpich -Dnvgroup=disabled >/dev/null
ninja -C "$build" >/dev/null
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(owned-requests host-staging-np1 host-staging-np2 comm-contexts-np1 comm-contexts-np3
         collectives-preload-np1 collectives-linked-np2
         bad-input-preload-np1 bad-input-linked-np3
         stream-attr-preload-np3 stream-attr-plain-np3 stream-attr-disabled-np2
         thread-level-default-np2 thread-level-ht-rule-np2 thread-level-forced-np2
         thread-level-off-np2 thread-level-device-rule-no-driver-np2
         host-routes-preload-np2 pmpi-tool-stacking-np2 fortran-preload-np1 fortran-linked-np3
         fake-cuda-selftest-memops-immediate fake-nccl-np2 fake-nccl-shared-gpu-np3
         fake-bc-np4 fake-divergent-random-np3
         fake-failures-pmpi-np2 fake-per-thread-ht-np2 fake-lifetime-many-np2
         fake-progress-waits-ht-np2 fake-progress-waits-nccl-np2
         thread-level-device-rule-driver-np2)
fi
rc=0
MPIRUN=mpiexec.mpich meson test -C "$build" --no-rebuild --print-errorlogs "${tests[@]}" || rc=$?
log="$build/meson-logs/testlog.json"
if [ -f "$log" ]; then
  count() { grep -c "\"result\": \"$1\"" "$log" || true; }
  echo "mpich: $(count OK) passed, $(( $(count FAIL) + $(count TIMEOUT) + $(count ERROR) )) failed, $(count SKIP) skipped"
fi
exit $rc
