#!/usr/bin/env bash
# The multi-node suite in one command: builds streamcoll (scripts/build.sh), brings up the
# test cluster (scripts/cluster.sh: N nodes of K ranks, shaped links), runs the tests of
# suite `mpi` on it (each test's mpirun spreads its ranks over the nodes: node layout,
# leaders and hierarchies are the real ones, nothing imposed), writes the results and
# tears the cluster down, whatever happens. Root only (network namespaces).
#
#   scripts/cluster-suite.sh [--nodes 2] [--ppn 2] [--rate 10gbit] [--multiplier 10]
#                            [--time-limit S] [--out DIR] [TEST ...]
#   --multiplier  meson's --timeout-multiplier: a test's time limit is this many times its
#                 one-node limit (ranks talk over TCP between namespaces that share this
#                 machine's cores; some tests run 10-40 times longer than on one node)
#   --time-limit  stop the suite after S seconds (default: none); the tests finished by
#                 then are reported, and the summary says the run was cut short
#   --out         where the results go (default bench/results/cluster_suite_<date>):
#                 testlog.json.gz and testlog.txt.gz (meson's), summary.txt (one line per
#                 test: result, seconds, name; then the counts), the command and cluster status
#   TEST ...      only these tests (default: every test of suite `mpi` but cluster-smoke,
#                 which builds a cluster of its own and is what CI runs, shortest on one
#                 node first, by the one-node durations in bench/results/suite_durations.txt
#                 where a test is listed there)
# Ends with "cluster suite: N passed, N failed, N skipped"; exit 1 when a test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=2 ppn=2 rate=10gbit mult=10 out="" limit=86400
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --ppn) ppn=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --multiplier) mult=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --time-limit) limit=$2; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    --*) echo "cluster-suite.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "cluster-suite.sh: needs root (network namespaces)" >&2; exit 2; }
out=${out:-bench/results/cluster_suite_$(date -u +%Y-%m-%d)}
mkdir -p "$out"
build=${BUILD_DIR:-build}
scripts/build.sh >/dev/null
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  durations=bench/results/suite_durations.txt  # "SECONDS NAME" per line, from one node
  while read -r name; do
    [ "$name" = cluster-smoke ] && continue
    d=$(awk -v n="$name" '$2 == n {print $1}' "$durations" 2>/dev/null | head -1)
    tests+=("${d:-0} $name")
  done < <(meson test -C "$build" --no-rebuild --list --suite mpi 2>/dev/null | sed -n 's|^.* / ||p')
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | sort -g | cut -d' ' -f2)
fi
trap 'scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
scripts/cluster.sh up --nodes "$nodes" --ppn "$ppn" --rate "$rate"
{
  echo "# scripts/cluster-suite.sh --nodes $nodes --ppn $ppn --rate $rate --multiplier $mult" \
       "(${#tests[@]} tests), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)," \
       "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  scripts/cluster.sh status
} >"$out/command.txt"
rc=0
# tests/mpi/run.sh's own limit (600 s) scaled like meson's: on one node the longest test
# takes 40 s, here some take ten times that (collectives-check-mode-np4 was cut at 600 s).
STREAMCOLL_RUN_TIMEOUT=$(awk -v m="$mult" 'BEGIN { printf "%d", 600 * m }')
export STREAMCOLL_RUN_TIMEOUT
# Each test's mpirun starts on node1 and spreads over the nodes (scripts/mpi-launcher.sh).
scripts/cluster.sh run --timeout "$limit" meson test -C "$build" --no-rebuild --print-errorlogs \
  --timeout-multiplier "$mult" "${tests[@]}" || rc=$?
cp "$build/meson-logs/testlog.json" "$build/meson-logs/testlog.txt" "$out/" 2>/dev/null || true
python3 - "$out/testlog.json" "${#tests[@]}" >"$out/summary.txt" <<'PY'
import json, os, sys
rows, counts = [], {}
for line in (open(sys.argv[1]) if os.path.exists(sys.argv[1]) else []):
    t = json.loads(line)
    rows.append((t["result"], t["duration"], t["name"]))
    counts[t["result"]] = counts.get(t["result"], 0) + 1
for r, d, n in sorted(rows, key=lambda x: x[2]):
    print(f"{r:8} {d:9.1f} s  {n}")
failed = sum(v for k, v in counts.items() if k not in ("OK", "SKIP", "EXPECTEDFAIL"))
print(f"cluster suite: {counts.get('OK', 0)} passed, {failed} failed, {counts.get('SKIP', 0)} skipped"
      + (f" (cut short: {len(rows)} of {sys.argv[2]} tests ran)" if len(rows) < int(sys.argv[2]) else ""))
PY
gzip -9f "$out/testlog.json" "$out/testlog.txt" 2>/dev/null || true
tail -1 "$out/summary.txt"
exit $rc
