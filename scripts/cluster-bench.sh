#!/usr/bin/env bash
# The host routes measured across nodes, on the test cluster (scripts/cluster.sh): 4 nodes
# of 2 ranks at each link rate, with Open MPI (MPICH's ranks poll without yielding, and 8
# of them on this machine's 2 cores take a scheduler slice per step: docs/guide.md, "MPICH").
# Root only; takes about an hour. Everything goes into OUT (default
# bench/results/cluster_<date>), with every command in its log:
#
#   RATE/fit.csv         allreduce on routes ht (rd, rabenseifner, ring) for the profile
#                        fit: 2 ranks on one node, 2 and 4 ranks one per node
#   RATE/autotune/       scripts/autotune.sh --np "4 8" (2x2 and 4x2): every host route and
#                        the MPI's own (Open MPI's tuned) interleaved, the table it writes
#                        (a multi-node table: rules by node count), its plots, the check
#   RATE/han.csv         the MPI's own with Open MPI's han component (coll_han_priority=100)
#                        at 4 and 8 ranks, rows named "pmpi han"
#   RATE/profile.toml    sc_model fit of RATE/fit.csv
#   RATE/model.txt       sc_model hosts with that profile against RATE's measurements
#   RATE/predict-OTHER.txt  the same profile taken to the other rate (level 1's bandwidth
#                        scaled by the ratio of the rates) against OTHER's measurements:
#                        the model's crossovers at a rate it was not fitted at
#   summary.txt          link checks, the winners per shape and rate, BlueConnect against
#                        the flat ring and rd and han, the crossover ratios
#
#   scripts/cluster-bench.sh [--out DIR] [--rates "1gbit 10gbit"] [--max-bytes 16M]
#   scripts/cluster-bench.sh measure DIR MAX_BYTES   (inside the cluster: one rate)
#   scripts/cluster-bench.sh model DIR [--rates ...] [--max-bytes 16M]
#                        the fits, models, predictions and summary again from DIR's
#                        measurements (after a change to the model; no cluster, no root)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD_DIR:-build}
case $build in /*) ;; *) build=$root/$build ;; esac

# ---- inside the cluster (scripts/cluster.sh run): one rate ------------------------------
if [ "${1:-}" = measure ]; then
  dir=$2 max=$3
  mkdir -p "$dir"
  source scripts/mpi-launcher.sh
  mpi_launcher "$(mpi_flavor_of "$build")"
  [ "$mpirun_kind" = openmpi ] || { echo "cluster-bench: Open MPI only (got $mpirun)" >&2; exit 2; }
  export OMPI_MCA_mpi_yield_when_idle=1 STREAMCOLL_THREAD_MULTIPLE=1
  log=$dir/log.txt
  bench() {  # NP CSV [mpirun args] -- sc_bench args
    local np=$1 csv=$2
    shift 2
    local margs=()
    while [ "$1" != -- ]; do margs+=("$1"); shift; done
    shift
    mpi_pass LD_PRELOAD STREAMCOLL_STATS
    local cmd=(env LD_PRELOAD="$build/libstreamcoll.so" STREAMCOLL_STATS=1 "$mpirun" "${mpirun_args[@]}"
               "${mpirun_pass[@]}" "${margs[@]}" -np "$np" "$build/bench/sc_bench" --coll allreduce
               --mem host --max-bytes "$max" --csv "$csv" --append --quiet "$@")
    echo "\$ ${cmd[*]}" >>"$log"
    "${cmd[@]}" >>"$log" 2>&1
  }
  ht=(--route ht:algo=rd --route ht:algo=rabenseifner --route ht:algo=ring)
  # The fit's rows: level 0 (one node), level 1 (one rank per node).
  bench 2 "$dir/fit.csv" -- "${ht[@]}"
  bench 2 "$dir/fit.csv" --map-by ppr:1:node -- "${ht[@]}"
  bench 4 "$dir/fit.csv" --map-by ppr:1:node -- "${ht[@]}"
  # Every route and the MPI's own, 2x2 and 4x2: the autotuner.
  echo "\$ scripts/autotune.sh --np '4 8' ..." >>"$log"
  BUILD_DIR=$build scripts/autotune.sh --no-build --np "4 8" --coll allreduce --max-bytes "$max" \
    --routes "pmpi ht:algo=rd ht:algo=rabenseifner ht:algo=ring blueconnect:backend=sched blueconnect:backend=sched:algo=ring" \
    --out "$dir/autotune" >>"$log" 2>&1
  # Open MPI's han (the hierarchical component) in place of tuned.
  (
    export OMPI_MCA_coll_han_priority=100
    for np in 4 8; do bench "$np" "$dir/han.raw.csv" -- --route pmpi; done
  )
  python3 - "$dir/han.raw.csv" "$dir/han.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
with open(sys.argv[2], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=rows[0].keys())
    w.writeheader()
    for r in rows:
        r["spec"], r["route"] = "pmpi:han", "pmpi han"
        w.writerow(r)
PY
  rm -f "$dir/han.raw.csv"
  exit 0
fi

# ---- outside: the clusters, the fits, the comparisons ------------------------------------
out=bench/results/cluster_$(date -u +%Y-%m-%d) rates="1gbit 10gbit" max=16M
model_only=0
if [ "${1:-}" = model ]; then
  [ $# -ge 2 ] || { echo "cluster-bench.sh model: the directory of an earlier run is needed" >&2; exit 2; }
  model_only=1 out=$2
  shift 2
fi
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift ;;
    --rates) rates=$2; shift ;;
    --max-bytes) max=$2; shift ;;
    *) echo "cluster-bench.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
case $out in /*) ;; *) out=$root/$out ;; esac
if [ $model_only = 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "cluster-bench.sh: needs root (scripts/cluster.sh)" >&2; exit 2; }
  mkdir -p "$out"
  scripts/build.sh >/dev/null
  trap 'scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
  commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  for rate in $rates; do
    scripts/cluster.sh up --nodes 4 --ppn 2 --rate "$rate"
    {
      echo "# scripts/cluster-bench.sh: commit $commit, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores"
      scripts/cluster.sh status
    } >"$out/cluster-$rate.txt"
    scripts/cluster.sh run --timeout 5400 scripts/cluster-bench.sh measure "$out/$rate" "$max"
    scripts/cluster.sh down
  done
else
  [ -x "$build/bench/sc_model" ] || { echo "cluster-bench.sh model: build $build first (scripts/build.sh)" >&2; exit 2; }
  for rate in $rates; do
    [ -f "$out/$rate/fit.csv" ] || { echo "cluster-bench.sh model: no $out/$rate/fit.csv" >&2; exit 2; }
  done
fi
for rate in $rates; do
  "$build/bench/sc_model" fit --in "$out/$rate/fit.csv" --out "$out/$rate/profile.toml" >"$out/$rate/fit.txt" ||
    echo "cluster-bench: no profile fitted at $rate (fit.txt says why); no model for it" >&2
done

rate_bits() {  # 1gbit -> 1000000000
  case $1 in
    *gbit) echo $(( ${1%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${1%mbit} * 1000000 )) ;;
  esac
}
for rate in $rates; do
  [ -f "$out/$rate/profile.toml" ] || continue
  measured=("$out/$rate/autotune/measured.csv")
  "$build/bench/sc_model" hosts --profile "$out/$rate/profile.toml" --ranks 4,8 --sizes "4:$max" \
    --measured "${measured[@]}" --csv "$out/$rate/model.csv" >"$out/$rate/model.txt"
  for other in $rates; do
    [ "$other" = "$rate" ] && continue
    f=$(python3 -c "print($(rate_bits "$other") / $(rate_bits "$rate"))")
    "$build/bench/sc_model" hosts --profile "$out/$rate/profile.toml" --ranks 4,8 --sizes "4:$max" \
      --scale "1=$f" --measured "$out/$other/autotune/measured.csv" \
      --csv "$out/$rate/predict-$other.csv" >"$out/$rate/predict-$other.txt"
  done
done
python3 scripts/cluster-summary.py "$out" $rates >"$out/summary.txt"
cat "$out/summary.txt"
