#!/usr/bin/env bash
# The suite under MPICH (Debian's mpich and libmpich-dev), in a second build folder
# (build-mpich: -Dmpi=mpich, no nvgroup kernels), run with mpiexec.mpich (the launcher
# scripts/mpi-launcher.sh picks for that build folder's MPI): every test at one and two
# ranks, and some at three and four (the list below), but the two that build a tree of their
# own (stub-route, build-without-cuda). What is left out and why: docs/guide.md, "MPICH".
# Ends with "mpich: N passed, N failed, N skipped". Without MPICH installed it says so and
# exits 0.
#   scripts/test-mpich.sh [TEST NAME ...]   (default: the set above)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MPICH_BUILD_DIR:-build-mpich}
if ! command -v mpiexec.mpich >/dev/null 2>&1 || ! pkg-config --exists mpich; then
  echo "mpich: not installed (apt-get install mpich libmpich-dev): skipped"
  exit 0
fi
[ -f "$build/build.ninja" ] ||
  meson setup "$build" --buildtype=release -Dmpi=mpich -Dnvgroup=disabled >/dev/null
# Quiet when it builds; the compiler's errors (ninja prints them on stdout) when it does not.
ninja -C "$build" >"$build/ninja.log" 2>&1 ||
  { tail -n 60 "$build/ninja.log"; echo "mpich: the build failed (above; $build/ninja.log)"; exit 1; }
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  # Every test at one or two ranks (and those without a rank count), and these at three
  # and four: MPICH's ranks spin without yielding, so where they outnumber the cores each
  # step waits for a scheduler slice (about 5 ms here; docs/guide.md, "MPICH").
  more=(comm-contexts-np3 bad-input-linked-np3 stream-attr-preload-np3 stream-attr-plain-np3
        fortran-linked-np3 fortran-f08-linked-np3 fake-nccl-shared-gpu-np3 fake-bc-np4
        fake-divergent-cases-np3 fake-divergent-random-np3 fusion-preload-np3
        fusion-table-np4 fake-classic-order-pmpi-np3 fake-classic-order-pmpi-np4
        fake-classic-order-nccl-np3 fake-classic-order-ht-np3 fake-classic-order-blueconnect-np4
        fake-divergent-signatures-np3 fake-divergent-signatures-set-route-np3
        fake-divergent-skew-bc-np4 fake-divergent-signatures-stream-bc-np4
        fortran-routes-bc-np4 fortran-f08-routes-ht-np4
        fake-capture-nccl-mixed-np3 fake-capture-ht-mixed-np3 fake-capture-nccl-all-np4
        fake-trace-np3 fake-capture-bc-mixed-np4
        fake-persistent-host-np3 fake-persistent-mixed-np3 fake-persistent-stream-mixed-np3
        fake-persistent-ht-stream-mixed-np3 fake-persistent-nccl-device-np3
        fake-persistent-ht-stream-np4 fortran-persistent-ht-np3
        fake-capture-crossed-ht-np3 fake-capture-threads-ht-np3 fake-comm-churn-np3
        fake-capture-threads-mixed-pmpi-np3 fake-lifetime-churn-check-np3
        fake-divergent-steady-np3 fake-divergent-steady-quiet-np3)
  while read -r name; do
    case $name in
      # The tests that build a tree of their own (a stub route; no CUDA) check the build's
      # structure, whatever the MPI: under Open MPI only (about 2 minutes saved).
      stub-route|build-without-cuda) ;;
      *-np[3-9]*) if [[ " ${more[*]} " == *" $name "* ]]; then tests+=("$name"); fi ;;
      *) tests+=("$name") ;;
    esac
  done < <(meson test -C "$build" --no-rebuild --list 2>/dev/null | sed -n 's|^.* / ||p')
fi
rc=0
meson test -C "$build" --no-rebuild --print-errorlogs "${tests[@]}" || rc=$?
log="$build/meson-logs/testlog.json"
if [ -f "$log" ]; then
  count() { grep -c "\"result\": \"$1\"" "$log" || true; }
  echo "mpich: $(count OK) passed, $(( $(count FAIL) + $(count TIMEOUT) + $(count ERROR) )) failed, $(count SKIP) skipped"
fi
# Both installations side by side under Lmod, when the Open MPI build is there too
# (scripts/test.sh builds it first).
source scripts/mpi-launcher.sh
openmpi_build=${BUILD_DIR:-build}
if [ $# -eq 0 ] && [ "$(mpi_flavor_of "$openmpi_build")" = openmpi ]; then
  st=0
  tests/tools/side_by_side.sh "$openmpi_build" "$build" || st=$?
  [ $st -eq 0 ] || [ $st -eq 77 ] || rc=1
fi
exit $rc
