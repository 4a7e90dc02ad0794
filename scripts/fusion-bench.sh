#!/usr/bin/env bash
# MPI_Iallreduce fusion measured (docs/guide.md, "Fusion"): bursts of N MPI_Iallreduce and one
# MPI_Waitall (sc_bench --burst), per call, on three communicators in one run:
#   table           nothing forced: the default table passes MPI_Iallreduce on host
#                   memory straight to the MPI (the MPI's own)
#   pmpi            forced: streamcoll's full routing path, then the MPI's call, unfused
#   pmpi:fuse=64K   forced with fuse=64K: fused
# on one node at 2 and 4 ranks and, as root with network namespaces, on the test cluster
# (scripts/cluster.sh) of 2 nodes x 2 ranks at 10 and 1 Gbit/s. Writes one log per run
# into OUT (default bench/results/fusion_<date>), REPS runs of each (the machine is small
# and shared by every rank and thread: runs differ), and prints the 8-byte rows.
#   scripts/fusion-bench.sh [OUT]    (BURST, default 100; ITERS, default 200; REPS, default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/fusion_$(date -u +%Y-%m-%d)}
burst=${BURST:-100} iters=${ITERS:-200} reps=${REPS:-3}
mkdir -p "$out"
scripts/build.sh >/dev/null
args=(--burst "$burst" -b 8 -e 1K -f 8 -n "$iters" --route table --route pmpi --route pmpi:fuse=64K)
export STREAMCOLL_THREAD_MULTIPLE=1  # routes forced at run time: the table cannot ask for it
run() {  # NAME CMD...: REPS runs, NAME_1.txt ...
  local name=$1 r
  shift
  for r in $(seq "$reps"); do
    echo "# $name run $r: $*"
    "$@" >"$out/${name}_$r.txt" 2>&1 || { tail -20 "$out/${name}_$r.txt"; return 1; }
    grep -E "^# route|^ +8 |^# fusion" "$out/${name}_$r.txt"
  done
}
for np in 2 4; do
  run "node1_np$np" scripts/bench-coll.sh "$np" "${args[@]}"
done
if [ "$(id -u)" -eq 0 ] && ip netns list >/dev/null 2>&1; then
  # (scripts/mpi-launcher.sh leaves progress threads unbound on the test cluster.)
  trap 'scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
  scripts/cluster.sh up --nodes 2 --ppn 2 --rate 10gbit >/dev/null
  run cluster_2x2_10gbit scripts/cluster.sh run --timeout 600 scripts/bench-coll.sh 4 "${args[@]}"
  STREAMCOLL_FUSION_CYCLE=100 run cluster_2x2_10gbit_cycle100 \
    scripts/cluster.sh run --timeout 600 scripts/bench-coll.sh 4 "${args[@]}"
  scripts/cluster.sh rate 1gbit >/dev/null
  run cluster_2x2_1gbit scripts/cluster.sh run --timeout 600 scripts/bench-coll.sh 4 "${args[@]}"
fi
