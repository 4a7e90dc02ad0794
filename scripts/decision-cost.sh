#!/usr/bin/env bash
# Instructions streamcoll adds per host collective call, counted by callgrind (the same on
# every run, unlike time): bench/passthrough_latency --via shim --cuda (every call through
# the shim, in a process that loaded the CUDA driver: the fake one of tests/fake), host
# buffers of BYTES, the default tuning table (or TABLE), at each rank count. Counted on
# rank 0 from the entry of the shim's MPI_<Coll> to its return, without the MPI's own
# collective inside it (callgrind toggles collection at both functions' entries and exits);
# the MPI's other calls that streamcoll makes (an agreement, a refresh, PMPI_Test) are in
# the count. Each configuration runs twice, with ITERS and 4 x ITERS calls per batch: the
# difference over the difference in calls is the steady state's price per call, without
# what the first calls of a signature cost once (the context, the first agreement).
# The CUDA driver's pointer queries are left out too (toggled at cuPointerGetAttributes):
# under valgrind every buffer needs one for a library older than the steady path, whose
# heap check read valgrind's own heap start, while natively a heap or stack buffer needs
# none; the fake driver's query costs far more than a real one. Printed per collective
# and rank count, per call: instructions in streamcoll, in the C and C++ runtime
# (libc, libstdc++, ld.so: streamcoll's allocations, locks, TLS lookups), and in the MPI
# library (streamcoll's own agreements and refreshes; a late peer's spinning too, which
# makes that column noisy, even negative).
#   scripts/decision-cost.sh [-n "2 4"] [-c "allreduce bcast allgather reduce"] [-b BYTES] [TABLE]
# Needs valgrind; BUILD_DIR (default build: the benchmark, the fake driver); LIB (default
# $BUILD_DIR/libstreamcoll.so: another build's library, to compare); ITERS (default 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
nps="2 4" colls="allreduce bcast allgather reduce" bytes=8
while getopts "n:c:b:" o; do
  case $o in
    n) nps=$OPTARG ;;
    c) colls=$OPTARG ;;
    b) bytes=$OPTARG ;;
    *) sed -n '2,18p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
table=${1:-}
build=${BUILD_DIR:-build}
iters=${ITERS:-1000}
lib=$(realpath "${LIB:-$build/libstreamcoll.so}")
command -v valgrind >/dev/null || { echo "decision-cost.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
env_args=()
[ -n "$table" ] && env_args+=(STREAMCOLL_TUNING_FILE="$PWD/$table")
mpi_pass LD_LIBRARY_PATH LD_PRELOAD ${table:+STREAMCOLL_TUNING_FILE}
rank_var=OMPI_COMM_WORLD_RANK
[ "$mpirun_kind" = openmpi ] || rank_var=PMI_RANK
echo "# scripts/decision-cost.sh: commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ), library $lib, $(basename "$mpirun") ($mpirun_kind)"
echo "# passthrough_latency --min $bytes --max $bytes --iters $iters and $((4 * iters)) --batches 3 --cuda --via shim; table: ${table:-default}"
printf '%-10s %3s %10s %18s %16s %12s\n' coll np calls "Ir/call(streamcoll)" "Ir/call(runtime)" "Ir/call(MPI)"
# Per object, the instructions collected on rank 0 and the shim calls: "calls object=Ir ...".
count() {
  local coll=$1 np=$2 n=$3 fn out
  fn="MPI_$(tr '[:lower:]' '[:upper:]' <<<"${coll:0:1}")${coll:1}"
  out=$tmp/cg.$coll.$np.$n
  env "${env_args[@]}" LD_LIBRARY_PATH="$PWD/$build/tests/fake/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    LD_PRELOAD="$lib" \
    "$mpirun" "${mpirun_args[@]}" "${mpirun_pass[@]}" -np "$np" \
    valgrind --tool=callgrind --callgrind-out-file="$out.%q{$rank_var}" \
    --collect-atstart=no --toggle-collect="$fn" --toggle-collect="P$fn" \
    --toggle-collect=cuPointerGetAttributes \
    "$build/bench/passthrough_latency" --min "$bytes" --max "$bytes" --iters "$n" --batches 3 \
    --cuda --via shim --coll "$coll" >"$tmp/log.$coll.$np.$n" 2>&1 ||
    { tail -30 "$tmp/log.$coll.$np.$n" >&2; exit 1; }
  sed -n 's/^# calls through the shim: //p' "$tmp/log.$coll.$np.$n"
  callgrind_annotate --threshold=100 "$out.0" | LIBOBJ="$lib" python3 -c '
import os, re, sys
groups = {"streamcoll": 0, "runtime": 0, "mpi": 0}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s.*\[(.*)\]\s*$", line)
    if not m:
        continue
    ir, obj = int(m.group(1).replace(",", "")), m.group(2)
    base = obj.rsplit("/", 1)[-1]
    if base.startswith("libstreamcoll") or obj == os.environ["LIBOBJ"]:
        groups["streamcoll"] += ir
    elif re.match(r"(libc\.|libstdc\+\+|ld-linux|libm\.|libgcc)", base):
        groups["runtime"] += ir
    else:
        groups["mpi"] += ir
print(" ".join(f"{k}={v}" for k, v in groups.items()))'
}
for coll in $colls; do
  for np in $nps; do
    a=$(count "$coll" "$np" "$iters")
    b=$(count "$coll" "$np" $((4 * iters)))
    python3 - "$coll" "$np" "$a" "$b" <<'PY'
import sys
coll, np, a, b = sys.argv[1:5]
def parse(t):
    calls, groups = t.split("\n")
    return int(calls), dict(kv.split("=") for kv in groups.split())
(c1, g1), (c2, g2) = parse(a), parse(b)
per = {k: (int(g2[k]) - int(g1[k])) / (c2 - c1) for k in g1}
print(f"{coll:<10} {np:>3} {c2 - c1:>10} {per['streamcoll']:>18.0f} {per['runtime']:>16.1f} {per['mpi']:>12.1f}")
PY
  done
done
