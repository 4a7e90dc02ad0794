#!/usr/bin/env bash
# A build on a machine without the CUDA toolkit (-Dcuda=disabled: no CUDA headers, so no
# GPU route but pmpi, ht and blueconnect on host memory) compiles, and its library passes
# a program's collectives through: collectives_check (every collective, datatype and op it
# claims, results compared against values computed independently) at 2 ranks, preloaded.
# Nothing else builds that configuration, so without this test it breaks unseen.
#   build_without_cuda.sh SOURCE_ROOT MPI PROGRAM
# (from the meson test `build-without-cuda`; MPI: the build's -Dmpi; PROGRAM:
# collectives_check_plain of this build, which is not linked with streamcoll.)
set -euo pipefail
src=$(cd "$1" && pwd) mpi=$2 prog=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "build-without-cuda: FAIL: $*" >&2; exit 1; }
# Away from the build folder the test runs in: meson setup ends with `ninja -t restat` and
# `-t cleandead` run in the current folder, which in the suite's build folder removed its
# outputs that ninja does not list (the Fortran module, libstreamcoll_fortran.a.p/streamcoll.mod).
cd "$work"
echo "build-without-cuda: building the library with -Dcuda=disabled"
meson setup "$work/build" "$src" -Dmpi="$mpi" -Dcuda=disabled -Dtests=false \
  --buildtype=debug -Doptimization=0 > "$work/setup.log" 2>&1 || { cat "$work/setup.log"; fail "meson setup"; }
lib=$(ninja -C "$work/build" -t targets all | sed -n 's/^\(libstreamcoll\.so[.0-9]*\): cpp_LINKER$/\1/p')
[ -n "$lib" ] || fail "no libstreamcoll.so target"
ninja -C "$work/build" "$lib" > "$work/build.log" 2>&1 || { grep -E "error|FAILED" "$work/build.log" | head -20; fail "the build"; }
grep -q "STREAMCOLL_HAVE_CUDA=0" "$work/build/build.ninja" || fail "the build did not leave CUDA out"
echo "build-without-cuda: collectives_check, 2 ranks, preloaded"
STREAMCOLL_LIB="$work/build/$lib" STREAMCOLL_RUN_TIMEOUT=240 \
  bash "$src/tests/mpi/run.sh" preload 2 "$prog" > "$work/run.log" 2>&1 || { tail -40 "$work/run.log"; fail "the run"; }
grep -E ' passed, 0 failed' "$work/run.log" || { tail -40 "$work/run.log"; fail "no clean result line"; }
echo "build-without-cuda: ok"
