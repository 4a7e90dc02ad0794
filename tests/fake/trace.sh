#!/usr/bin/env bash
# Seeing what streamcoll did, against the fakes: tests/fake/capture.cpp's mixed mode (a
# step of 6 collectives on the attached stream, replayed from a CUDA graph on some ranks
# while others call live, 100 steps) at NP ranks, with STREAMCOLL_TIMELINE and NVTX
# observed through the injection library (tests/tools/nvtx_inject.cpp), statistics on:
# - the timeline parses, has every rank's calls, as many per (collective, route) as the
#   statistics count, stream-ordered and replayed calls, GPU spans that begin after
#   their host spans; scripts/plot_timeline.py renders it;
# - the NVTX ranges in domain "streamcoll": one "MPI_<Coll>" and one "<coll> <route> ..."
#   range per call the statistics count, balanced, the routes named as categories;
# - a second run at 2 ranks with routes forced (allreduce on nvgroup, which cannot run
#   there: the two GPUs have no peer access, FAKE_CUDA_PEERS=none; the rest on ht): a mark with the reason per allreduce
#   that falls back, and the progress thread's ranges for ht's host collectives;
# - ranks that exit without MPI_Finalize (NO_FINALIZE, 2 ranks) each write their own
#   records to FILE.rank<N>.
#   trace.sh RUN_SH NP PROGRAM NVTX_INJECT_LIB OUT_DIR NO_FINALIZE
set -euo pipefail
run=$1 np=$2 prog=$3 lib=$4 out=$5 no_finalize=$6
tests=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$out" && mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }
STREAMCOLL_TIMELINE=$out/timeline.json NVTX_INJECTION64_PATH=$lib NVTX_INJECT_OUT=$out/nvtx.%p.txt \
  "$run" preload "$np" "$prog" mixed >"$out/run.log" 2>&1 || { cat "$out/run.log"; fail "the run"; }
cat "$out/run.log"
/usr/bin/python3 "$tests/tools/check_timeline.py" "$out/timeline.json" --ranks "$np" --min-calls 600 \
  --stats-log "$out/run.log" --mode-min stream 300 --mode-min captured 300 --gpu-spans-min 500 \
  --plot-with "$tests/../scripts/plot_timeline.py" || fail "the timeline"
reports=("$out"/nvtx.*.txt)
[ "${#reports[@]}" = "$np" ] || fail "expected $np NVTX reports, got ${#reports[@]}"
/usr/bin/python3 "$tests/tools/nvtx_inject_check.py" "${reports[@]}" --balanced \
  --stats-log "$out/run.log" --category streamcoll 2 nccl --depth streamcoll 2 ||
  fail "the NVTX ranges"
mkdir -p "$out/forced"
STREAMCOLL_ROUTE=allreduce:nvgroup,bcast:ht,reduce:ht,allgather:ht,reduce_scatter_block:ht \
  STREAMCOLL_NCCL_LIB=/nonexistent/libnccl.so.2 FAKE_CUDA_PEERS=none NVTX_INJECTION64_PATH=$lib NVTX_INJECT_OUT=$out/forced/nvtx.%p.txt \
  "$run" preload 2 "$prog" mixed >"$out/forced/run.log" 2>&1 || { cat "$out/forced/run.log"; fail "the forced run"; }
/usr/bin/python3 "$tests/tools/nvtx_inject_check.py" "$out"/forced/nvtx.*.txt --balanced \
  --stats-log "$out/forced/run.log" --mark-prefix streamcoll "allreduce: route nvgroup (STREAMCOLL_ROUTE)" 200 \
  --mark-prefix streamcoll "iallreduce: route nvgroup (STREAMCOLL_ROUTE)" 200 \
  --range-min streamcoll "ht: host collective of a GPU call (progress thread)" 800 ||
  fail "the NVTX ranges and marks of the forced run"
STREAMCOLL_TIMELINE=$out/exit.json "$run" preload 2 "$no_finalize" >"$out/exit.log" 2>&1 || true
for r in 0 1; do
  /usr/bin/python3 - "$out/exit.json.rank$r" "$r" <<'PY' || fail "rank $r's timeline at exit"
import json, sys
d = json.load(open(sys.argv[1]))
calls = [e for e in d["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
assert d["otherData"]["streamcoll"] == "timeline", d["otherData"]
assert len(calls) == 5 and all(e["pid"] == int(sys.argv[2]) and e["args"]["coll"] == "allreduce" for e in calls), calls
print(sys.argv[1], "has its 5 calls")
PY
done
echo "trace: ok"
