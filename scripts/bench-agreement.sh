#!/usr/bin/env bash
# The price of agreeing on what ranks see (docs/design.md, "Safety rules"), on host-memory
# MPI_Allreduce in a process that loaded the CUDA driver: bench/passthrough_latency
# --cuda, which alternates batches through streamcoll and straight to PMPI_ in one
# process, under the fake CUDA driver of tests/fake (no GPU needed; a real driver where
# one is installed: set FAKE_CUDA_DIR= empty). Per rank count and configuration, RUNS
# runs; prints each run's table and the median ratio per size.
#   scripts/bench-agreement.sh [RUNS] [LIB ...]
# LIB: streamcoll libraries to compare (default: this build's). Configurations:
#   staged      the MPI as it is (Debian's Open MPI is not CUDA-aware: GPU buffers are
#               staged, and every call with data exchanges staging outcomes)
#   cuda-aware  STREAMCOLL_MPI_CUDA_AWARE=yes (no staging, no outcome exchange)
#   no-driver   without --cuda: the pass-through path (target: ratio <= 1.02)
#   staged-system, cuda-aware-system   the first two on a communicator that asserts host
#               memory (--assert-kinds system: mpi_assert_memory_alloc_kinds)
# SC_BENCH_NP: rank counts (default "2 4"); SC_BENCH_ARGS: passthrough_latency options
# (default --min 8 --max 64 --iters 2000 --batches 11; add --coll bcast, allgather or
# reduce for another host collective).
# Then bench/stream_skew per rank count, collective and route (allreduce, bcast and
# allgather on nccl, the fake NCCL, and on ht; allreduce and allgather on nvgroup and, at
# 4 ranks, blueconnect) and library: rank 0's host time of a
# stream-ordered call on device memory, with every rank
# on time and with the last rank 300 ms late (target: independent of the lateness after
# the signature's first call, < 5 ms). SC_SKEW_ARGS: its options (default --rounds 10);
# SC_SKIP_SKEW=1 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
build=${BUILD_DIR:-build}
libs=("$@")
[ ${#libs[@]} -eq 0 ] && libs=("$PWD/$build/libstreamcoll.so")
fake=${FAKE_CUDA_DIR-$PWD/$build/tests/fake/cuda}
read -r -a args <<< "${SC_BENCH_ARGS:---min 8 --max 64 --iters 2000 --batches 11}"
mpi=(mpirun -np)
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  [ "$(id -u)" -eq 0 ] && mpi=(mpirun --allow-run-as-root -np)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null); $(nproc) cores; runs $runs; ${args[*]}"
for np in ${SC_BENCH_NP:-2 4}; do
  for config in staged cuda-aware no-driver staged-system cuda-aware-system; do
    for lib in "${libs[@]}"; do
      env_=(LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
      extra=()
      case $config in
        cuda-aware) env_+=(STREAMCOLL_MPI_CUDA_AWARE=yes); extra=(--cuda) ;;
        staged) extra=(--cuda) ;;
        cuda-aware-system) env_+=(STREAMCOLL_MPI_CUDA_AWARE=yes); extra=(--cuda --assert-kinds system) ;;
        staged-system) extra=(--cuda --assert-kinds system) ;;
        no-driver) env_=(LD_PRELOAD="$lib") ;;
      esac
      key=$(echo "$np@$config@$lib" | tr '/' '_')
      for i in $(seq 1 "$runs"); do
        echo "## $np ranks, $config, $lib, run $i"
        env "${env_[@]}" "${mpi[@]}" "$np" "$build/bench/passthrough_latency" "${args[@]}" \
          "${extra[@]}" --csv "$tmp/$key-$i.csv"
      done
    done
  done
done
echo "## median over runs of the streamcoll/PMPI ratio (own: streamcoll's collectives per call)"
python3 - "$tmp" <<'PY'
import csv, glob, os, statistics, sys
d = sys.argv[1]
groups = {}
for f in sorted(glob.glob(f"{d}/*.csv")):
    key = os.path.basename(f).rsplit("-", 1)[0]  # NP@CONFIG@LIB-RUN.csv
    for r in csv.DictReader(open(f)):
        g = groups.setdefault(key, {}).setdefault(int(r["bytes"]), [[], []])
        g[0].append(float(r["ratio"]))
        g[1].append(float(r.get("own_per_call") or 0))
for key in groups:
    np_, config, lib = key.split("@", 2)
    for b in sorted(groups[key]):
        ratios, own = groups[key][b]
        print(f"{np_} ranks  {config:<17}  {lib.replace('_', '/'):<50}  {b:>6} B  "
              f"ratio {statistics.median(ratios):.3f}  own {statistics.median(own):.4f}  "
              f"(runs {', '.join(f'{x:.3f}' for x in ratios)})")
PY
[ "${SC_SKIP_SKEW:-0}" = 1 ] && exit 0
echo "## stream-ordered calls with a late rank (bench/stream_skew)"
read -r -a skew_args <<< "${SC_SKEW_ARGS:---rounds 10 --late-ms 300}"
for np in ${SC_BENCH_NP:-2 4}; do
  # MPI_Allreduce, MPI_Bcast and MPI_Allgather on nccl and on ht; MPI_Allreduce and
  # MPI_Allgather on nvgroup (every rank on one fake GPU) and, at 4 ranks, on blueconnect
  # (hierarchy 2x2, NCCL stages).
  cases=(allreduce:nccl allreduce:ht bcast:nccl allgather:nccl bcast:ht allgather:ht
         allreduce:nvgroup:chunk=4K:blocks=4 allgather:nvgroup:chunk=4K:blocks=4)
  [ "$np" = 4 ] && cases+=(allreduce:blueconnect:hierarchy=2x2 allgather:blueconnect:hierarchy=2x2)
  for case in "${cases[@]}"; do
    coll=${case%%:*} route=${case#*:}
    bus=per-rank
    [[ $route == nvgroup* ]] && bus=same
    for lib in "${libs[@]}"; do
      echo "## $np ranks, $coll on route $route, $lib"
      env LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        STREAMCOLL_STATS=1 STREAMCOLL_THREAD_MULTIPLE=1 \
        STREAMCOLL_NCCL_LIB="$PWD/$build/tests/fake/libfakenccl.so" FAKE_CUDA_BUS_ID=$bus \
        FAKE_CUDA_MALLOC_SHM=1 STREAMCOLL_ROUTE="$coll:$route" \
        "${mpi[@]}" "$np" "$build/bench/stream_skew" --coll "$coll" "${skew_args[@]}" || true
    done
  done
done
