#!/usr/bin/env bash
# The per-call cost of streamcoll's routing decision, in instructions (callgrind, which
# counts the same on every run), with and without the decision cache
# (STREAMCOLL_DECISION_CACHE): one rank, host-buffer MPI_Allreduce of 8 bytes through
# bench/passthrough_latency, under a tuning table with host rules (TABLE, default the
# 28-rule table of bench/results/autotune_host_2core), so every call takes the full
# decision path. Counted inside the shim's dispatch (inclusive: the decision, the MPI's
# own allreduce it passes the call to, the statistics), per call, and the table walk
# (TuningTable::match) or the cache lookup (DecisionCache::lookup) alone.
#   scripts/decision-cost.sh [TABLE]      (needs valgrind; BUILD_DIR, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
table=${1:-bench/results/autotune_host_2core/table.txt}
command -v valgrind >/dev/null || { echo "decision-cost.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
iters=1000 batches=3
echo "# scripts/decision-cost.sh $table: commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "# $(grep -vc '^#' "$table") rules; passthrough_latency --min 8 --max 8 --iters $iters --batches $batches, 1 rank"
printf '%-8s %10s %16s %14s %14s\n' cache calls "Ir/call(dispatch)" "Ir/call(walk)" "Ir/call(cache)"
for cache in 0 1; do
  out=$tmp/cg.$cache
  env STREAMCOLL_DECISION_CACHE=$cache STREAMCOLL_TUNING_FILE="$PWD/$table" \
    LD_PRELOAD="$PWD/$build/libstreamcoll.so" "$mpirun" "${mpirun_args[@]}" -np 1 \
    valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*dispatch_described*' \
    "$build/bench/passthrough_latency" --min 8 --max 8 --iters $iters --batches $batches >/dev/null 2>&1
  python3 - "$out" "$cache" <<'PY'
import re, subprocess, sys
out, cache = sys.argv[1], sys.argv[2]
incl = subprocess.run(["callgrind_annotate", "--inclusive=yes", out], capture_output=True, text=True).stdout
tree = subprocess.run(["callgrind_annotate", "--tree=caller", out], capture_output=True, text=True).stdout
def ir(pattern, text=incl):
    for line in text.splitlines():
        if re.search(pattern, line):
            return int(line.split()[0].replace(",", ""))
    return 0
total = ir(r"PROGRAM TOTALS")
calls = 0
lines = tree.splitlines()
for k, line in enumerate(lines):  # the callers of dispatch_described, above its '*' line
    if re.search(r"\*\s+\?\?\?:streamcoll::\(anonymous namespace\)::dispatch_described", line):
        b = k - 1
        while b >= 0 and "<" in lines[b]:
            m = re.search(r"\(([\d,]+)x\)", lines[b])
            calls += int(m.group(1).replace(",", "")) if m else 0
            b -= 1
        break
calls = calls or 1
walk = ir(r"TuningTable::match")
look = ir(r"DecisionCache::lookup")
print(f"{cache:<8} {calls:>10} {total / calls:>16.0f} {walk / calls:>14.0f} {look / calls:>14.0f}")
PY
done
