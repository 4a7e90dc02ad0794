#!/usr/bin/python3
"""Checks a streamcoll timeline file (STREAMCOLL_TIMELINE) for the tests.

    tests/tools/check_timeline.py FILE --ranks N
        [--calls-per-rank K | --min-calls K] [--route-count ROUTE COLL N]...
        [--gpu-spans-min N] [--plot-with scripts/plot_timeline.py]
        [--stats-log FILE] [--mode-min MODE N]...

The format (MPI_Finalize writes it; Chrome trace event format):
    {"displayTimeUnit": "ns",
     "otherData": {"streamcoll": "timeline", "ranks": N, "dropped": D, "capacity": C},
     "traceEvents": [metadata ("ph": "M") and complete events ("ph": "X")]}
pid = rank in MPI_COMM_WORLD; tid 0 = the host span of a call, tid 1 = the GPU span of
the host event with the same args.seq; ts/dur in µs on one time base (0 = earliest).

Checks:
  - the file parses as JSON, is an object, displayTimeUnit is "ns";
  - otherData.streamcoll == "timeline", otherData.ranks == N, dropped an integer >= 0,
    capacity an integer > 0; traceEvents a list;
  - every event is an object with ph "M" or "X"; every rank 0..N-1 has its
    process_name ("rank R") and thread_name (tid 0, tid 1) metadata;
  - every "X" event: name a string, pid in 0..N-1, tid 0 or 1, ts and dur finite
    numbers with ts >= 0 and dur >= 0; the earliest ts is below 1 µs (0 = earliest);
  - host events (tid 0): args has coll, route (strings), nonblocking (bool), bytes,
    comm_size, seq (integers >= 0), mem (string) and mode (stream, classic, captured
    or host); no seq twice on one rank;
  - every rank has host events (unless --calls-per-rank 0), and when dropped == 0
    their seqs are 0..count-1 without gaps;
  - --calls-per-rank K: count == K on every rank (when dropped > 0: count <= K and
    every seq < K); --min-calls K: count >= K on every rank;
  - GPU spans (tid 1): args.seq names a host event on the same pid, at most one GPU
    span per host event, ts_gpu >= ts_host - 1.0 µs, and args.host_ts equals that
    host event's ts (within 0.01 µs);
  - --route-count ROUTE COLL N (repeatable): the host events, over all ranks, with
    args.route == ROUTE and args.coll == COLL number exactly N;
  - --gpu-spans-min N: at least N GPU spans over all ranks;
  - --stats-log FILE: a log holding streamcoll's statistics table (STREAMCOLL_STATS=1,
    rank 0's stderr at MPI_Finalize): for every (collective, route) the table's calls,
    summed over memory kinds, equal the timeline's host events (collective "iallreduce"
    for a non-blocking allreduce), and the timeline has no pair the table lacks;
  - --mode-min MODE N (repeatable): at least N host events with args.mode == MODE;
  - --plot-with SCRIPT: SCRIPT FILE -o TEMP.png exits 0 and writes a non-empty PNG
    (SCRIPT is run by its shebang when executable, else by /usr/bin/python3).

Prints every failure (at most 10 instances of one kind, then a count) and exits 1,
or prints one summary line and exits 0. Usage errors exit 2. Needs no matplotlib.
"""

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile

MODES = ("stream", "classic", "captured", "host")
HOST_TS_TOLERANCE = 0.01  # µs: args.host_ts against the host event's ts
GPU_BEGIN_TOLERANCE = 1.0  # µs: a GPU span may begin this much before its host span
SHOWN = 10  # instances of one kind of failure listed


class Failures:
    """Failures by kind, in the order first seen; a kind lists SHOWN instances."""

    def __init__(self):
        self.kinds = collections.OrderedDict()

    def add(self, kind, text):
        self.kinds.setdefault(kind, []).append(text)

    def __bool__(self):
        return bool(self.kinds)

    def report(self, path, out=sys.stdout):
        total = sum(len(v) for v in self.kinds.values())
        print(f"check_timeline.py: {path}: FAILED ({total} failures)", file=out)
        for kind, texts in self.kinds.items():
            for t in texts[:SHOWN]:
                print(f"  {kind}: {t}", file=out)
            if len(texts) > SHOWN:
                print(f"  {kind}: ... and {len(texts) - SHOWN} more", file=out)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_header(doc, ranks, fail):
    """otherData and the top level; returns dropped (0 when unusable)."""
    if doc.get("displayTimeUnit") != "ns":
        fail.add("header", f"displayTimeUnit is {doc.get('displayTimeUnit')!r}, not \"ns\"")
    other = doc.get("otherData")
    if not isinstance(other, dict):
        fail.add("header", "otherData is missing or not an object")
        return 0
    if other.get("streamcoll") != "timeline":
        fail.add("header", f"otherData.streamcoll is {other.get('streamcoll')!r}, "
                           "not \"timeline\"")
    if other.get("ranks") != ranks or not is_int(other.get("ranks")):
        fail.add("header", f"otherData.ranks is {other.get('ranks')!r}, expected {ranks}")
    dropped = other.get("dropped")
    if not is_int(dropped) or dropped < 0:
        fail.add("header", f"otherData.dropped is {dropped!r}, not an integer >= 0")
        dropped = 0
    capacity = other.get("capacity")
    if not is_int(capacity) or capacity <= 0:
        fail.add("header", f"otherData.capacity is {capacity!r}, not an integer > 0")
    return dropped


def check_metadata(meta, ranks, fail):
    """Every rank has process_name "rank R" and thread_name for tids 0 and 1."""
    for r in range(ranks):
        if meta.get((r, "process_name", None)) != f"rank {r}":
            fail.add("metadata", f"rank {r}: process_name is "
                                 f"{meta.get((r, 'process_name', None))!r}, not 'rank {r}'")
        for tid in (0, 1):
            if not isinstance(meta.get((r, "thread_name", tid)), str):
                fail.add("metadata", f"rank {r}: no thread_name for tid {tid}")


def check_host_args(where, args, fail):
    """A host event's args; returns its seq or None."""
    for key in ("coll", "route", "mem"):
        if not isinstance(args.get(key), str) or not args.get(key):
            fail.add("host args", f"{where}: args.{key} is {args.get(key)!r}, not a name")
    if not isinstance(args.get("nonblocking"), bool):
        fail.add("host args", f"{where}: args.nonblocking is {args.get('nonblocking')!r}, "
                              "not a bool")
    for key in ("bytes", "comm_size", "seq"):
        v = args.get(key)
        if not is_int(v) or v < 0:
            fail.add("host args", f"{where}: args.{key} is {v!r}, not an integer >= 0")
    if args.get("mode") not in MODES:
        fail.add("host args", f"{where}: args.mode is {args.get('mode')!r}, not one of "
                              f"{', '.join(MODES)}")
    seq = args.get("seq")
    return seq if is_int(seq) and seq >= 0 else None


def check_events(events, ranks, fail):
    """Per-event checks; returns (hosts, gpus, meta): hosts {rank: {seq: event}},
    gpus [(index, event)] and the metadata {(pid, name, tid): args.name}."""
    hosts = collections.defaultdict(dict)
    gpus = []
    meta = {}
    min_ts = None
    for i, e in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict):
            fail.add("event", f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph == "M":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            tid = e.get("tid") if e.get("name") == "thread_name" else None
            meta[(e.get("pid"), e.get("name"), tid)] = args.get("name")
            continue
        if ph != "X":
            fail.add("event", f"{where}: ph is {ph!r}, not \"M\" or \"X\"")
            continue
        pid, tid, ts, dur = e.get("pid"), e.get("tid"), e.get("ts"), e.get("dur")
        ok = True
        if not isinstance(e.get("name"), str):
            fail.add("event", f"{where}: name is {e.get('name')!r}, not a string")
        if not is_int(pid) or not 0 <= pid < ranks:
            fail.add("event", f"{where}: pid {pid!r} is not a rank in 0..{ranks - 1}")
            ok = False
        if tid not in (0, 1) or not is_int(tid):
            fail.add("event", f"{where}: tid {tid!r} is not 0 (host) or 1 (GPU)")
            ok = False
        timed = True  # a bad time is reported, but the event still counts as a call
        if not is_num(ts) or ts < 0:
            fail.add("time", f"{where}: ts {ts!r} is not a number >= 0")
            timed = False
        if not is_num(dur) or dur < 0:
            fail.add("time", f"{where}: dur {dur!r} is not a number >= 0")
        if not ok:
            continue
        if timed:
            min_ts = ts if min_ts is None else min(min_ts, ts)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        where = f"{where} (rank {pid}, {e.get('name')!r})"
        if tid == 0:
            seq = check_host_args(where, args, fail)
            if seq is None:
                continue
            if seq in hosts[pid]:
                fail.add("seq", f"{where}: seq {seq} appears twice on rank {pid}")
                continue
            hosts[pid][seq] = e
        else:
            if timed:
                gpus.append((i, e))
    if min_ts is not None and min_ts >= 1.0:
        fail.add("time", f"the earliest span begins at {min_ts} µs, not at 0 "
                         "(0 = the earliest event)")
    return hosts, gpus, meta


def check_calls(hosts, ranks, dropped, per_rank, min_calls, fail):
    for r in range(ranks):
        seqs = sorted(hosts.get(r, {}))
        if not seqs and per_rank != 0:
            fail.add("calls", f"rank {r}: no host events")
            continue
        if dropped == 0 and seqs != list(range(len(seqs))):
            gaps = sorted(set(range(seqs[-1] + 1)) - set(seqs))
            fail.add("seq", f"rank {r}: host seqs 0..{seqs[-1]} have gaps (dropped 0): "
                            f"missing {gaps[:10]}"
                            + (" ..." if len(gaps) > 10 else ""))
        if per_rank is not None:
            if dropped == 0 and len(seqs) != per_rank:
                fail.add("calls", f"rank {r}: {len(seqs)} host events, expected {per_rank}")
            elif dropped > 0 and (len(seqs) > per_rank or (seqs and seqs[-1] >= per_rank)):
                fail.add("calls", f"rank {r}: {len(seqs)} host events up to seq "
                                  f"{seqs[-1]}, expected {per_rank} calls "
                                  f"({dropped} dropped)")
        if min_calls is not None and len(seqs) < min_calls:
            fail.add("calls", f"rank {r}: {len(seqs)} host events, expected at least "
                              f"{min_calls}")


def check_gpu(hosts, gpus, fail):
    seen = set()
    for i, e in gpus:
        pid = e["pid"]
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        seq = args.get("seq")
        where = f"traceEvents[{i}] (rank {pid} GPU, {e.get('name')!r})"
        if not is_int(seq):
            fail.add("gpu", f"{where}: args.seq is {seq!r}, not an integer")
            continue
        host = hosts.get(pid, {}).get(seq)
        if host is None:
            fail.add("gpu", f"{where}: no host event with seq {seq} on rank {pid}")
            continue
        if (pid, seq) in seen:
            fail.add("gpu", f"{where}: a second GPU span for seq {seq}")
        seen.add((pid, seq))
        if not is_num(host["ts"]):
            continue  # the host event's bad ts is reported already
        if e["ts"] < host["ts"] - GPU_BEGIN_TOLERANCE:
            fail.add("gpu", f"{where}: begins at {e['ts']} µs, before its host event "
                            f"(seq {seq}, {host['ts']} µs)")
        host_ts = args.get("host_ts")
        if not is_num(host_ts) or abs(host_ts - host["ts"]) > HOST_TS_TOLERANCE:
            fail.add("gpu", f"{where}: args.host_ts {host_ts!r} is not its host event's "
                            f"ts {host['ts']}")


def check_route_counts(hosts, wanted, fail):
    counts = collections.Counter()
    for per_rank in hosts.values():
        for e in per_rank.values():
            args = e.get("args") or {}
            counts[(args.get("route"), args.get("coll"))] += 1
    for route, coll, n in wanted:
        got = counts[(route, coll)]
        if got != n:
            present = ", ".join(f"{r} {c}: {k}" for (r, c), k in sorted(
                counts.items(), key=lambda x: (str(x[0][0]), str(x[0][1])))) or "none"
            fail.add("route count", f"{route} {coll}: {got} host events, expected {n} "
                                    f"(present: {present})")


def stats_counts(path, fail):
    """{(collective, route): calls} from a statistics table in a log, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail.add("stats", f"{path}: {e.strerror or e}")
        return None
    counts = collections.Counter()
    inside = False
    for line in lines:
        if line.startswith("collective") and "route" in line and "calls" in line:
            inside = True
            continue
        if inside:
            f = line.split()
            if len(f) < 4 or not f[3].isdigit():
                break
            counts[(f[0], f[1])] += int(f[3])
    if not inside:
        fail.add("stats", f"{path}: no statistics table")
        return None
    return counts


def check_stats(hosts, path, fail):
    want = stats_counts(path, fail)
    if want is None:
        return
    got = collections.Counter()
    for per_rank in hosts.values():
        for e in per_rank.values():
            a = e.get("args") or {}
            coll = ("i" if a.get("nonblocking") else "") + str(a.get("coll"))
            got[(coll, a.get("route"))] += 1
    for key in sorted(set(want) | set(got), key=str):
        if want[key] != got[key]:
            fail.add("stats", f"{key[0]} on {key[1]}: {got[key]} host events, the "
                              f"statistics count {want[key]} calls")


def check_modes(hosts, wanted, fail):
    modes = collections.Counter()
    for per_rank in hosts.values():
        for e in per_rank.values():
            modes[(e.get("args") or {}).get("mode")] += 1
    for mode, n in wanted:
        if modes[mode] < n:
            fail.add("mode", f"{modes[mode]} host events in mode {mode}, expected at least {n}")


def png_ok(path):
    """None when `path` is a non-empty PNG, else why not."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as e:
        return f"not written ({e.strerror or e})"
    if not head:
        return "empty"
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return "not a PNG"
    return None


def check_plot(script, path, fail):
    if not os.path.isfile(script):
        fail.add("plot", f"{script}: no such file")
        return
    with tempfile.TemporaryDirectory(prefix="check_timeline.") as tmp:
        png = os.path.join(tmp, "timeline.png")
        if os.access(script, os.X_OK):
            cmd = [os.path.abspath(script)]
        else:
            cmd = ["/usr/bin/python3" if os.path.exists("/usr/bin/python3")
                   else sys.executable, script]
        cmd += [path, "-o", png]
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=300, universal_newlines=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            fail.add("plot", f"{' '.join(cmd)}: {e}")
            return
        if p.returncode != 0:
            tail = " | ".join(p.stdout.strip().splitlines()[-5:])
            fail.add("plot", f"{os.path.basename(script)} exited {p.returncode}: {tail}")
            return
        why = png_ok(png)
        if why:
            fail.add("plot", f"{os.path.basename(script)} exited 0 but the PNG is {why}")


def check(path, ranks, per_rank=None, min_calls=None, route_counts=(), gpu_min=None,
          plot_with=None, stats_log=None, mode_min=()):
    """(Failures, summary line)."""
    fail = Failures()
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        fail.add("json", f"cannot read: {e.strerror or e}")
        return fail, ""
    except (ValueError, UnicodeDecodeError) as e:
        fail.add("json", f"does not parse as JSON: {e}")
        return fail, ""
    if not isinstance(doc, dict):
        fail.add("json", f"the top level is a {type(doc).__name__}, not an object")
        return fail, ""
    dropped = check_header(doc, ranks, fail)
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        fail.add("header", "traceEvents is missing or not a list")
        events = []
    hosts, gpus, meta = check_events(events, ranks, fail)
    check_metadata(meta, ranks, fail)
    check_calls(hosts, ranks, dropped, per_rank, min_calls, fail)
    check_gpu(hosts, gpus, fail)
    check_route_counts(hosts, route_counts, fail)
    if gpu_min is not None and len(gpus) < gpu_min:
        fail.add("gpu", f"{len(gpus)} GPU spans, expected at least {gpu_min}")
    if stats_log:
        check_stats(hosts, stats_log, fail)
    check_modes(hosts, mode_min, fail)
    if plot_with:
        check_plot(plot_with, path, fail)
    n_host = sum(len(v) for v in hosts.values())
    return fail, (f"{ranks} ranks, {n_host} host events, {len(gpus)} GPU spans, "
                  f"dropped {dropped}")


def count(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a count (>= 0)")
    return v


def main(argv):
    ap = argparse.ArgumentParser(
        description="Check a streamcoll timeline (STREAMCOLL_TIMELINE) file; exit 1 "
                    "listing every failure.")
    ap.add_argument("file", metavar="FILE")
    ap.add_argument("--ranks", type=count, required=True, metavar="N",
                    help="ranks in MPI_COMM_WORLD")
    calls = ap.add_mutually_exclusive_group()
    calls.add_argument("--calls-per-rank", type=count, metavar="K",
                       help="exactly K host events (seq 0..K-1) on every rank")
    calls.add_argument("--min-calls", type=count, metavar="K",
                       help="at least K host events on every rank")
    ap.add_argument("--route-count", nargs=3, action="append", default=[],
                    metavar=("ROUTE", "COLL", "N"),
                    help="exactly N host events with this route and collective, over all "
                         "ranks (repeatable)")
    ap.add_argument("--gpu-spans-min", type=count, metavar="N",
                    help="at least N GPU spans over all ranks")
    ap.add_argument("--plot-with", metavar="SCRIPT",
                    help="run SCRIPT FILE -o TEMP.png and check the PNG")
    ap.add_argument("--stats-log", metavar="FILE",
                    help="a log with streamcoll's statistics table: its calls per "
                         "(collective, route) equal the timeline's")
    ap.add_argument("--mode-min", nargs=2, action="append", default=[],
                    metavar=("MODE", "N"), help="at least N host events in MODE (repeatable)")
    args = ap.parse_args(argv)
    mode_min = []
    for mode, n in args.mode_min:
        if mode not in MODES:
            ap.error(f"--mode-min {mode}: not one of {', '.join(MODES)}")
        try:
            mode_min.append((mode, count(n)))
        except (ValueError, argparse.ArgumentTypeError):
            ap.error(f"--mode-min {mode} {n}: N is not a count")
    route_counts = []
    for route, coll, n in args.route_count:
        try:
            route_counts.append((route, coll, count(n)))
        except (ValueError, argparse.ArgumentTypeError):
            ap.error(f"--route-count {route} {coll} {n}: N is not a count")
    fail, line = check(args.file, args.ranks, args.calls_per_rank, args.min_calls,
                       route_counts, args.gpu_spans_min, args.plot_with, args.stats_log,
                       mode_min)
    if fail:
        fail.report(args.file)
        return 1
    print(f"check_timeline.py: {args.file}: ok: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
