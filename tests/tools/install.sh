#!/usr/bin/env bash
# A site installation, for real: `meson install` into a fresh tree (DESTDIR), Lmod's
# `module load streamcoll` from it (the modulefile finds the tree from where it lies),
# then, with only what the module set: streamcoll-info (its JSON parses, with a tuning
# table), pkg-config streamcoll, an installed example compiled
# with the MPI's mpicc and run by its mpirun under streamcoll-exec (streamcoll's statistics prove it was
# preloaded in the ranks, while mpirun and the shell never had LD_PRELOAD set), the
# installed default table loaded by name, the installed autotuner writing a table, and
# `module unload` putting the environment back.
#   install.sh BUILD_DIR
set -euo pipefail
build=$1
fail() { echo "FAIL: $*"; exit 1; }
lmod_init=/usr/share/lmod/lmod/init/bash
[ -r "$lmod_init" ] || { echo "SKIP: Lmod is not installed ($lmod_init)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
DESTDIR="$tmp/root" meson install -C "$build" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "meson install"; }
modules=$(find "$tmp/root" -type d -path '*/share/modulefiles' | head -n 1)
[ -n "$modules" ] || fail "no modulefiles installed"
prefix=${modules%/share/modulefiles}

unset LD_PRELOAD STREAMCOLL_PREFIX STREAMCOLL_PRELOAD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
set +u  # Lmod's shell functions read unset variables
# shellcheck disable=SC1090
source "$lmod_init"
module use "$modules"
module load streamcoll || fail "module load streamcoll"
set -u
[ "${STREAMCOLL_PREFIX:-}" = "$prefix" ] || fail "STREAMCOLL_PREFIX=${STREAMCOLL_PREFIX:-} (want $prefix)"
[ -e "$STREAMCOLL_PRELOAD" ] || fail "STREAMCOLL_PRELOAD=$STREAMCOLL_PRELOAD does not exist"
[ -z "${LD_PRELOAD:-}" ] || fail "the module set LD_PRELOAD"
[ "$(command -v streamcoll-info)" = "$prefix/bin/streamcoll-info" ] || fail "streamcoll-info not from the module's PATH"

streamcoll-info --json >"$tmp/info.json" || fail "streamcoll-info"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["streamcoll"]["version"]; assert r["tuning table"]["rules"]' \
  "$tmp/info.json" || fail "streamcoll-info --json"
pkg-config --exists streamcoll || fail "pkg-config streamcoll"
[ "$(pkg-config --variable=preload streamcoll)" -ef "$STREAMCOLL_PRELOAD" ] || fail "pkg-config preload variable"
read -r inc _ <<<"$(pkg-config --cflags-only-I streamcoll)"
[ "${inc#-I}" -ef "$prefix/include" ] && [ -e "${inc#-I}/streamcoll/streamext.h" ] ||
  fail "pkg-config --cflags: $inc"

# The MPI the installation is for (pkg-config's mpi variable) picks the compiler wrapper
# and the launcher (the installed share/streamcoll/mpi-launcher.sh) where several MPIs are
# installed (Debian: mpicc.openmpi and mpicc.mpich); MPICC and MPIRUN override.
flavor=$(pkg-config --variable=mpi streamcoll)
source "$prefix/share/streamcoll/mpi-launcher.sh"
mpi_launcher "$flavor"
case $flavor in openmpi | mpich) mpicc=mpicc.$flavor ;; *) mpicc=mpicc ;; esac
command -v "$mpicc" >/dev/null || mpicc=mpicc
mpicc=${MPICC:-$mpicc}
echo "MPI: $flavor ($mpicc, $mpirun)"
"$mpicc" $(pkg-config --cflags streamcoll) "$prefix/share/streamcoll/examples/allreduce.c" -o "$tmp/allreduce" ||
  fail "$mpicc of the installed example"
mpi_args=("${mpirun_args[@]}" -np 2)
STREAMCOLL_STATS=1 STREAMCOLL_TUNING_FILE="$prefix/share/streamcoll/default.table" STREAMCOLL_TIMELINE="$tmp/timeline.json" \
  timeout 120 "$mpirun" "${mpi_args[@]}" streamcoll-exec "$tmp/allreduce" >"$tmp/run.log" 2>&1 ||
  { cat "$tmp/run.log"; fail "mpirun streamcoll-exec"; }
grep -q "allreduce over 2 ranks: 3 (right)" "$tmp/run.log" || { cat "$tmp/run.log"; fail "the example's result"; }
grep -q "streamcoll statistics" "$tmp/run.log" || { cat "$tmp/run.log"; fail "streamcoll was not preloaded in the ranks"; }
grep -q "STREAMCOLL_TUNING_FILE\|cannot open" "$tmp/run.log" && { cat "$tmp/run.log"; fail "the installed default table did not load"; }
# Without the wrapper the same program runs without streamcoll (nothing preloaded globally).
STREAMCOLL_STATS=1 timeout 120 "$mpirun" "${mpi_args[@]}" "$tmp/allreduce" >"$tmp/plain.log" 2>&1 ||
  { cat "$tmp/plain.log"; fail "mpirun without the wrapper"; }
grep -q "streamcoll statistics" "$tmp/plain.log" && fail "streamcoll loaded without streamcoll-exec"
streamcoll-exec true || fail "streamcoll-exec true (a non-MPI program under the wrapper)"
# The Fortran stream module, where the build had a Fortran compiler: a program that says
# `use streamcoll`, built with the MPI's Fortran wrapper and pkg-config streamcoll-fortran,
# sees streamcoll under streamcoll-exec and not without it.
if pkg-config --exists streamcoll-fortran; then
  case $flavor in openmpi | mpich) mpifc=mpif90.$flavor ;; *) mpifc=mpif90 ;; esac
  command -v "$mpifc" >/dev/null || mpifc=mpif90
  [ -e "$(pkg-config --variable=fmoddir streamcoll-fortran)/streamcoll.mod" ] ||
    fail "pkg-config streamcoll-fortran: no streamcoll.mod in its fmoddir"
  [ -e "${STREAMCOLL_FMODDIR:-}/streamcoll.mod" ] || fail "the module's STREAMCOLL_FMODDIR has no streamcoll.mod"
  printf '%s\n' 'program p' '  use streamcoll' '  include "mpif.h"' '  integer :: ierr, rank' \
    '  call mpi_init(ierr)' '  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)' \
    '  if (rank == 0) print "(a,l1)", "available: ", streamcoll_stream_available()' \
    '  call mpi_finalize(ierr)' 'end program' >"$tmp/avail.f90"
  "$mpifc" $(pkg-config --cflags streamcoll-fortran) "$tmp/avail.f90" -o "$tmp/avail" \
    $(pkg-config --libs streamcoll-fortran) || fail "$mpifc with pkg-config streamcoll-fortran"
  timeout 60 "$mpirun" "${mpi_args[@]}" streamcoll-exec "$tmp/avail" >"$tmp/avail.log" 2>&1 ||
    { cat "$tmp/avail.log"; fail "the Fortran module's program under streamcoll-exec"; }
  grep -q "available: T" "$tmp/avail.log" || { cat "$tmp/avail.log"; fail "use streamcoll: not available under streamcoll-exec"; }
  timeout 60 "$mpirun" "${mpi_args[@]}" "$tmp/avail" >"$tmp/avail.log" 2>&1 ||
    { cat "$tmp/avail.log"; fail "the Fortran module's program"; }
  grep -q "available: F" "$tmp/avail.log" || { cat "$tmp/avail.log"; fail "use streamcoll: available without streamcoll"; }
fi
# The installed timeline script reads the example's timeline (both ranks' allreduce).
python3 "$prefix/share/streamcoll/plot_timeline.py" "$tmp/timeline.json" --summary >"$tmp/summary" ||
  fail "the installed plot_timeline.py --summary"
grep -qE "^ +all +pmpi +2 " "$tmp/summary" || { cat "$tmp/summary"; fail "the example's timeline: 2 pmpi calls"; }
# The installed plotting scripts' route names (routes.txt, written from the route table).
[ "$(python3 "$prefix/share/streamcoll/route_names.py" | tr '\n' ' ')" = \
  "$(streamcoll-info --routes | sed -n 's/^| `\([a-z]*\)` |.*/\1/p' | tr '\n' ' ')" ] ||
  fail "the installed route_names.py does not name the routes streamcoll-info --routes does"
# The installed autotuner, on the installed tools: a tiny run writes a table that loads.
(cd "$tmp" && MPIRUN=$mpirun timeout 300 streamcoll-autotune --np 2 --max-bytes 64 --iters 3 --warmup 1 --no-plot \
   --out tune >"$tmp/tune.log" 2>&1) || { tail -n 30 "$tmp/tune.log"; fail "streamcoll-autotune"; }
grep -q "^allreduce" "$tmp/tune/table.txt" || fail "streamcoll-autotune wrote no allreduce rule"

set +u
module unload streamcoll
set -u
[ -z "${STREAMCOLL_PREFIX:-}" ] || fail "module unload left STREAMCOLL_PREFIX"
case ":$PATH:" in *":$prefix/bin:"*) fail "module unload left $prefix/bin in PATH" ;; esac  # (Lmod also drops duplicates)
echo "install and module: 1 passed, 0 failed"
