#!/usr/bin/env bash
# Route blueconnect on host buffers with imposed hierarchies against the MPI's own
# collectives, same run: builds if needed, then runs bench/hier_latency under
# mpirun with streamcoll preloaded and STREAMCOLL_STATS=1 (the route of every variant's
# first call is checked), for each NP in $NPS (default "4 8"):
#   1. allreduce, 4 B .. 16 MiB (x4), RUNS times (default 5): the MPI, blueconnect with
#      every 2-level hierarchy (and the 3-level one) with backend=sched, one backend=mpi
#      variant, ht rabenseifner and ring; per size the median/min latency and the ratio
#      variant/MPI; then the median over the runs of each ratio (and its range)
#   2. briefly, reduce_scatter_block and allgather, up to 1 MiB, once
# and writes bench/results/blueconnect_host_np$NP.txt (first line: the command; then the
# machine, and for each run the exact mpirun line and its raw output).
#   [NPS="4 8"] [RUNS=5] [BUILD_DIR=build] scripts/bench-bc.sh [hier_latency options]
# Options given here are appended to every run (later options win), e.g. --iters 50,
# --hier 2x4,2x4:mpi, --ht none, --max 1M.
# On a machine with fewer cores than ranks the ranks are oversubscribed (--oversubscribe,
# --bind-to none, OMPI_MCA_mpi_yield_when_idle=1) and the header of each file says so.
set -euo pipefail
cd "$(dirname "$0")/.."
invocation=""
for v in NPS RUNS BUILD_DIR; do
  [ -n "${!v:-}" ] && invocation+="$v=\"${!v}\" "
done
invocation+="scripts/bench-bc.sh${*:+ $*}"
nps=${NPS:-4 8}
runs=${RUNS:-5}
build=${BUILD_DIR:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
# Only the library and this benchmark (configured as scripts/build.sh does, if needed),
# so that a broken file elsewhere in the tree does not stop the benchmark.
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release >/dev/null
meson compile -C "$build" streamcoll hier_latency >/dev/null
lib=$build/libstreamcoll.so
bench=$build/bench/hier_latency

cores=$(nproc)
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
mpi_version=$("$mpirun" --version 2>&1 | head -n 1)
envs=(LD_PRELOAD="$lib" STREAMCOLL_STATS=1)
extra=("${mpirun_args[@]}")
[ "$mpirun_kind" = openmpi ] && envs+=(OMPI_MCA_mpi_yield_when_idle=1)
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || uname -s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rc=0
mkdir -p bench/results
# One mpirun: its command line into the file, its output (stdout and stderr) after it.
run_one() {
  local np=$1 out=$2
  shift 2
  echo "# env ${envs[*]} $mpirun -np $np ${extra[*]} $bench $*" >>"$out"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine perturbs the numbers)" >>"$out"
  echo "## np $np: hier_latency $*" >&2
  local st=0
  env "${envs[@]}" timeout 400 "$mpirun" -np "$np" "${extra[@]}" "$bench" "$@" >>"$out" 2>&1 || st=$?
  echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
  if [ "$st" -ne 0 ]; then
    echo "# exit status $st" >>"$out"
    rc=1
  fi
}

for np in $nps; do
  out=bench/results/blueconnect_host_np$np.txt
  {
    echo "# command: $invocation"
    echo "# machine: $cores cores, $os, $mpi_version, no GPU; $(date -u +%Y-%m-%dT%H:%M:%SZ); commit $commit"
    if [ "$np" -gt "$cores" ]; then
      echo "# OVERSUBSCRIBED: $np ranks on $cores cores (mpirun --oversubscribe --bind-to none,"
      echo "# OMPI_MCA_mpi_yield_when_idle=1). Ranks share cores and wait for the OS scheduler, so"
      echo "# the absolute latencies are not those of a real node, and algorithms with more"
      echo "# dependent steps (more stages, more messages in sequence) pay for it most. Compare"
      echo "# the ratios within a run, and their spread over the runs, not absolute numbers."
    fi
    echo "# One node, shared memory: the imposed hierarchies have no faster inner links to exploit."
  } >"$out"
  for i in $(seq 1 "$runs"); do
    echo "## allreduce run $i of $runs" >>"$out"
    run_one "$np" "$out" --coll allreduce --min 4 --max 16M --iters 200 --min-iters 20 \
      --warmup 3 --csv "$tmp/np$np-run$i.csv" "$@"
  done
  echo "## median over $runs runs of the ratio variant/mpi (allreduce; in brackets the lowest and highest run)" >>"$out"
  python3 - "$tmp" "$np" "$runs" >>"$out" 2>&1 <<'PY' || rc=1
import csv, os, statistics, sys
d, np, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
ratios, order = {}, []
for i in range(1, runs + 1):
    path = f"{d}/np{np}-run{i}.csv"
    if not os.path.exists(path):
        continue
    for r in csv.DictReader(open(path)):
        if r["variant"] == "mpi":
            continue
        if r["variant"] not in order:
            order.append(r["variant"])
        ratios.setdefault((int(r["bytes"]), r["variant"]), []).append(float(r["ratio"]))
sizes = sorted({b for b, _ in ratios})
w = max([21] + [len(v) for v in order])
print(f"{'bytes':>10} " + " ".join(f"{v:>{w}}" for v in order) + f" {'best bc':>{w}}")
for b in sizes:
    cells, best = [], None
    for v in order:
        x = ratios.get((b, v), [])
        if not x:
            cells.append(f"{'-':>{w}}")
            continue
        m = statistics.median(x)
        cells.append(f"{f'{m:.3f} [{min(x):.2f}-{max(x):.2f}]':>{w}}")
        if v.startswith("bc ") and (best is None or m < best[1]):
            best = (v, m)
    tail = f"{best[0]} {best[1]:.3f}" if best else "-"
    print(f"{b:>10} " + " ".join(cells) + f" {tail:>{w}}")
PY
  echo "## reduce_scatter_block and allgather, one run" >>"$out"
  run_one "$np" "$out" --coll reduce_scatter_block,allgather --min 4 --max 1M --iters 150 \
    --min-iters 15 --warmup 2 "$@"
  echo "## wrote $out" >&2
done
exit $rc
