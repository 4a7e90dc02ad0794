#!/usr/bin/env bash
# Pass-through overhead: runs bench/passthrough_latency RUNS times (default 5) with 2 ranks
# under LD_PRELOAD and prints each run's table and the median of the per-run ratios at
# each size.
#   scripts/bench-passthrough.sh [RUNS] [benchmark options]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
shift || true
scripts/build.sh >/dev/null
build=${BUILD_DIR:-build}
mpi_args=(-np 2)
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  mpi_args+=(--bind-to core)
  [ "$(id -u)" -eq 0 ] && mpi_args+=(--allow-run-as-root)
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  echo "## run $i"
  LD_PRELOAD="$PWD/$build/libstreamcoll.so" mpirun "${mpi_args[@]}" \
    "$build/bench/passthrough_latency" --csv "$tmp/run$i.csv" "$@"
done
echo "## median over $runs runs of the shim/direct ratio"
python3 - "$tmp" "$runs" <<'PY'
import csv, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
rows = {}
for i in range(1, runs + 1):
    for r in csv.DictReader(open(f"{d}/run{i}.csv")):
        rows.setdefault(int(r["bytes"]), []).append(float(r["ratio"]))
for b in sorted(rows):
    print(f"{b:>10} B  median ratio {statistics.median(rows[b]):.4f}  (runs: {', '.join(f'{x:.4f}' for x in rows[b])})")
PY
