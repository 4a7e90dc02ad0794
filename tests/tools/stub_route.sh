#!/usr/bin/env bash
# Adding a route is one file plus one row (docs/design.md, "Adding a route"), checked: a
# copy of the source tree gets route stub (tests/tools/stub_route/stub.cpp as
# algorithms/stub.cpp, and row.def appended to base/routes.def) and no other change. Its
# build (the library and streamcoll-info only; no NCCL, no kernels) must
#   - list the route (streamcoll-info --routes) and accept it in STREAMCOLL_ROUTE;
#   - send it the calls a rule names: fake_classic_order (classic MPI_Allreduce on fake
#     GPU buffers written on the application's streams; every result checked) under
#     STREAMCOLL_ROUTE=allreduce:stub shows its allreduce calls on route stub in the
#     statistics (--expect), and the route's shutdown hook (its entry in the registry,
#     made from the row) reports a count of calls over 0 on every rank;
#   - and the check itself fails where it must: the same run forced to pmpi fails --expect.
#   stub_route.sh SOURCE_ROOT FAKE_CLASSIC_ORDER FAKE_CUDA_DIR MPI
# (MPI: the build's -Dmpi, so that the copy is built for the MPI the program is)
# (from the meson test `stub-route`; the copy and its build under a temporary folder).
set -euo pipefail
src=$(cd "$1" && pwd) prog=$(realpath "$2") fake_cuda_dir=$(realpath "$3") mpi=$4
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "stub-route: FAIL: $*" >&2; exit 1; }
# Away from the build folder the test runs in: meson setup ends with `ninja -t restat` and
# `-t cleandead` run in the current folder, which in the suite's build folder removed its
# outputs that ninja does not list (the Fortran module, libstreamcoll_fortran.a.p/streamcoll.mod).
cd "$work"

mkdir "$work/src"
tar -C "$src" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$work/src" -xf -
cp "$here/stub_route/stub.cpp" "$work/src/algorithms/stub.cpp"
cat "$here/stub_route/row.def" >> "$work/src/base/routes.def"
# The change is those two files: the copy differs from the source in nothing else.
changed=$(diff -rq "$src" "$work/src" -x 'build*' -x .git 2>&1 | sort || true)
expected=$(printf '%s\n' "Files $src/base/routes.def and $work/src/base/routes.def differ" \
                         "Only in $work/src/algorithms: stub.cpp" | sort)
[ "$changed" = "$expected" ] || fail "the copy differs in more than the route's file and row: $changed"

echo "stub-route: building the copy (library and streamcoll-info; no NCCL, no kernels)"
meson setup "$work/build" "$work/src" -Dmpi="$mpi" -Dtests=false -Dnccl=disabled -Dnvgroup=disabled \
  --buildtype=debug -Doptimization=0 > "$work/setup.log" 2>&1 || { cat "$work/setup.log"; fail "meson setup"; }
lib_target=$(ninja -C "$work/build" -t targets all | sed -n 's/^\(libstreamcoll\.so[.0-9]*\): cpp_LINKER$/\1/p')
[ -n "$lib_target" ] || fail "no libstreamcoll.so target in the copy's build"
ninja -C "$work/build" "$lib_target" tools/streamcoll-info > "$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "the build"; }
grep -q 'algorithms_stub.cpp' "$work/build/build.ninja" || fail "the build did not compile algorithms/stub.cpp"

"$work/build/tools/streamcoll-info" --routes > "$work/routes.txt"
grep -q '`stub`' "$work/routes.txt" || { cat "$work/routes.txt"; fail "streamcoll-info --routes does not list route stub"; }

run() {  # ROUTE_SPEC EXPECT: the classic-order run on the copy's library
  env STREAMCOLL_LIB="$work/build/$lib_target" STREAMCOLL_ROUTE="$1" \
      STREAMCOLL_NCCL_LIB=/nonexistent/libnccl.so.2 FAKE_CUDA_DEFER=1 FAKE_CUDA_BUS_ID=per-rank \
      LD_LIBRARY_PATH="$fake_cuda_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      STREAMCOLL_RUN_TIMEOUT=240 bash "$src/tests/mpi/run.sh" preload 2 "$prog" --expect="$2"
}
echo "stub-route: fake_classic_order, 2 ranks, allreduce forced to stub"
run allreduce:stub allreduce:stub > "$work/run.log" 2>&1 || { cat "$work/run.log"; fail "the run on route stub"; }
cat "$work/run.log"
n=$(grep -c 'route stub carried [1-9][0-9]* call(s)' "$work/run.log" || true)
[ "$n" = 2 ] || fail "route stub's shutdown hook did not report calls on both ranks ($n of 2)"
grep -q 'unknown route\|not a route' "$work/run.log" && fail "STREAMCOLL_ROUTE=allreduce:stub was not understood"

echo "stub-route: the check itself: the same run forced to pmpi must fail --expect=allreduce:stub"
if run allreduce:pmpi allreduce:stub > "$work/neg.log" 2>&1; then
  cat "$work/neg.log"; fail "--expect=allreduce:stub passed on route pmpi"
fi
echo "stub-route: ok (one file, one row: built, listed, routed to, checked)"
