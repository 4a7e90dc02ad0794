#!/usr/bin/env bash
# A CUDA program's small host collectives through streamcoll: bench/passthrough_latency
# (host buffers of 8 to MAX bytes, MPI_FLOAT) in a process that loaded the CUDA driver
# (--cuda; the fake one of tests/fake on a machine without a GPU, the real one where
# LD_LIBRARY_PATH finds it first), each run alternating calls through the shim and
# straight to the MPI in one process, with a barrier before each batch (batches) and back
# to back (tight); RUNS runs of each, at each rank count and collective. With
# NODRIVER=1 also without any CUDA driver (the pass-through fast path). Writes each run's
# table to OUT (default a temporary folder) and prints, per rank count, collective and
# loop, the median over runs of the per-run medians: the MPI's own time, streamcoll's,
# their ratio and the nanoseconds added per call, at 8 B and at MAX.
#   scripts/bench-host-calls.sh [RUNS]
# LIB (default build/libstreamcoll.so), BUILD_DIR (default build: the benchmark and the
# fake driver), NPS (default "2 4"), COLLS (default "allreduce bcast allgather reduce"),
# MAX (default 64), ITERS (default 2000), OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
build=${BUILD_DIR:-build}
lib=$(realpath "${LIB:-$build/libstreamcoll.so}")
nps=${NPS:-2 4}
colls=${COLLS:-allreduce bcast allgather reduce}
max=${MAX:-64}
iters=${ITERS:-2000}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
source scripts/mpi-launcher.sh
mpi_launcher "$(mpi_flavor_of "$build")"
# One core per rank where the ranks fit on the cores (the launcher's own default here is
# no binding: ranks may outnumber cores in the tests).
launch_for() {
  local np=$1 i
  launch=()
  for ((i = 0; i < ${#mpirun_args[@]}; i++)); do
    if [ "${mpirun_args[i]}" = --bind-to ] && [ "$np" -le "$(nproc)" ]; then
      i=$((i + 1))  # (its value too)
      continue
    fi
    launch+=("${mpirun_args[i]}")
  done
  if [ "$np" -le "$(nproc)" ]; then
    [ "$mpirun_kind" = openmpi ] && launch+=(--bind-to core)
    [ "$mpirun_kind" = hydra ] && launch+=(-bind-to core)
  fi
  return 0
}
drivers="cuda"
[ "${NODRIVER:-0}" = 1 ] && drivers="cuda nodriver"
echo "# scripts/bench-host-calls.sh $runs: commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ), library $lib, $(basename "$mpirun") ($mpirun_kind), $(nproc) cores"
for run in $(seq 1 "$runs"); do
  for np in $nps; do
    for coll in $colls; do
      for loop in batches tight; do
        for driver in $drivers; do
          f=$out/$driver-np$np-$coll-$loop-$run.txt
          if [ "$driver" = cuda ]; then
            ldpath=$PWD/$build/tests/fake/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            args=(--cuda)
          else
            ldpath=${LD_LIBRARY_PATH:-}
            args=()
          fi
          mpi_pass LD_LIBRARY_PATH LD_PRELOAD
          launch_for "$np"
          LD_LIBRARY_PATH=$ldpath LD_PRELOAD=$lib "$mpirun" "${launch[@]}" \
            "${mpirun_pass[@]}" -np "$np" \
            "$build/bench/passthrough_latency" --max "$max" --iters "$iters" --coll "$coll" \
            --loop "$loop" "${args[@]}" --csv "$f.csv" >"$f" 2>&1 ||
            { cat "$f" >&2; exit 1; }
        done
      done
    done
  done
done
python3 - "$out" "$max" <<'PY'
import csv, glob, os, statistics, sys
d, mx = sys.argv[1], int(sys.argv[2])
rows = {}
for f in glob.glob(f"{d}/*.csv"):
    driver, np, coll, loop, run = os.path.basename(f)[:-8].split("-")
    for r in csv.DictReader(open(f)):
        rows.setdefault((driver, np, coll, loop, int(r["bytes"])), []).append(r)
print(f"{'driver':8} {'np':4} {'coll':10} {'loop':8} {'bytes':>5} {'MPI us':>8} {'shim us':>8} "
      f"{'ratio':>7} {'added ns':>9}  runs (ratio / added ns)")
for key in sorted(rows, key=lambda k: (k[0], k[1], k[2], k[3], k[4])):
    if key[4] not in (8, mx):
        continue
    rs = rows[key]
    med = lambda name: statistics.median(float(r[name]) for r in rs)
    each = ", ".join(f"{float(r['ratio']):.3f}/{float(r['added_ns']):.0f}" for r in rs)
    print(f"{key[0]:8} {key[1]:4} {key[2]:10} {key[3]:8} {key[4]:>5} {med('direct_us'):8.3f} "
          f"{med('shim_us'):8.3f} {med('ratio'):7.3f} {med('added_ns'):9.1f}  {each}")
PY
