#!/usr/bin/env bash
# Two installations side by side, one per MPI (docs/guide.md, "Installing for a site"): each
# build folder installed into a fresh tree of its own (DESTDIR), both trees' modulefile
# directories on MODULEPATH. `module load streamcoll/VERSION-MPI` must select that
# installation (its prefix, its streamcoll-info, built for that MPI, its pkg-config
# file), loading the other one must swap it out (Lmod's one-name rule), and each installed
# example must run under its own MPI with streamcoll preloaded by streamcoll-exec.
#   side_by_side.sh OPENMPI_BUILD_DIR MPICH_BUILD_DIR
set -euo pipefail
fail() { echo "FAIL: $*"; exit 1; }
lmod_init=/usr/share/lmod/lmod/init/bash
[ -r "$lmod_init" ] || { echo "SKIP: Lmod is not installed ($lmod_init)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A build=([openmpi]=$1 [mpich]=$2) prefix=()
version=
modulepath=()
for mpi in openmpi mpich; do
  DESTDIR="$tmp/$mpi" meson install -C "${build[$mpi]}" --no-rebuild --quiet >"$tmp/install-$mpi.log" 2>&1 ||
    { cat "$tmp/install-$mpi.log"; fail "meson install of ${build[$mpi]}"; }
  modules=$(find "$tmp/$mpi" -type d -path '*/share/modulefiles' | head -n 1)
  [ -n "$modules" ] || fail "${build[$mpi]} installed no modulefiles"
  prefix[$mpi]=${modules%/share/modulefiles}
  lua=$(ls "$modules/streamcoll/")
  [ "${lua%-$mpi.lua}-$mpi.lua" = "$lua" ] || fail "${build[$mpi]} installed modulefile $lua (want VERSION-$mpi.lua)"
  version=${lua%-$mpi.lua}
  modulepath+=("$modules")
done

unset LD_PRELOAD STREAMCOLL_PREFIX STREAMCOLL_PRELOAD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
set +u  # Lmod's shell functions read unset variables
# shellcheck disable=SC1090
source "$lmod_init"
module use "${modulepath[@]}"
avail=$(module -t avail streamcoll 2>&1)
set -u
for mpi in openmpi mpich; do
  grep -q "streamcoll/$version-$mpi" <<<"$avail" || fail "module avail does not list streamcoll/$version-$mpi: $avail"
done
passed=0
for mpi in mpich openmpi; do
  set +u
  module load "streamcoll/$version-$mpi" || fail "module load streamcoll/$version-$mpi"
  loaded=$(module -t list 2>&1 | grep -c '^streamcoll' || true)
  set -u
  [ "$loaded" = 1 ] || fail "after loading $mpi, $loaded streamcoll modules are loaded (want 1: swapped)"
  [ "$STREAMCOLL_PREFIX" = "${prefix[$mpi]}" ] || fail "$mpi: STREAMCOLL_PREFIX=$STREAMCOLL_PREFIX"
  [ "$(command -v streamcoll-info)" = "$STREAMCOLL_PREFIX/bin/streamcoll-info" ] ||
    fail "$mpi: streamcoll-info is $(command -v streamcoll-info)"
  streamcoll-info --json --no-mpi >"$tmp/info-$mpi.json" || fail "$mpi: streamcoll-info"
  built_for=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["streamcoll"]["built for mpi"])' "$tmp/info-$mpi.json")
  case $mpi:$built_for in
    openmpi:"Open MPI"* | mpich:MPICH*) ;;
    *) fail "$mpi: streamcoll-info says it is built for '$built_for'" ;;
  esac
  [ "$(pkg-config --variable=mpi streamcoll)" = "$mpi" ] || fail "$mpi: pkg-config says $(pkg-config --variable=mpi streamcoll)"
  source "$STREAMCOLL_PREFIX/share/streamcoll/mpi-launcher.sh"
  mpi_launcher "$mpi"
  "mpicc.$mpi" $(pkg-config --cflags streamcoll) "$STREAMCOLL_PREFIX/share/streamcoll/examples/allreduce.c" \
    -o "$tmp/allreduce-$mpi" || fail "mpicc.$mpi of the installed example"
  STREAMCOLL_STATS=1 timeout 120 "$mpirun" "${mpirun_args[@]}" -np 2 streamcoll-exec "$tmp/allreduce-$mpi" \
    >"$tmp/run-$mpi.log" 2>&1 || { cat "$tmp/run-$mpi.log"; fail "$mpi: $mpirun streamcoll-exec"; }
  grep -q "allreduce over 2 ranks: 3 (right)" "$tmp/run-$mpi.log" &&
    grep -q "streamcoll statistics" "$tmp/run-$mpi.log" || { cat "$tmp/run-$mpi.log"; fail "$mpi: the example under streamcoll"; }
  echo "streamcoll/$version-$mpi: $built_for, $mpirun, example right under streamcoll"
  passed=$((passed + 1))
done
set +u
module unload streamcoll
set -u
[ -z "${STREAMCOLL_PREFIX:-}" ] || fail "module unload left STREAMCOLL_PREFIX"
echo "side by side: $passed passed, 0 failed"
