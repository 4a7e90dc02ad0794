#!/usr/bin/python3
"""Plots a streamcoll timeline: every rank's collective calls against time.

Usage:
  scripts/plot_timeline.py TIMELINE.json -o OUT.png [--start US] [--end US] [--title T]
  scripts/plot_timeline.py TIMELINE.json --summary [--start US] [--end US]

Input: the file MPI_Finalize writes with STREAMCOLL_TIMELINE=path (Chrome trace event
format; Perfetto and chrome://tracing open it too):
    {"displayTimeUnit": "ns",
     "otherData": {"streamcoll": "timeline", "ranks": N, "dropped": D, "capacity": C},
     "traceEvents": [ metadata ("ph": "M": process_name, thread_name) and one
                      complete event ("ph": "X") per span ]}
pid is the rank in MPI_COMM_WORLD; tid 0 is the calling host thread's span of a call
(entry to return), tid 1 the GPU-side span (CUDA events around the operation on the
stream) of the host event with the same args.seq. ts and dur are microseconds on one
time base for all ranks (0 = the earliest event). A host event's args carry coll,
route, nonblocking, bytes, mem, mode, comm_size and seq; a GPU span's args carry seq
and host_ts, and it takes its route from its host event.

The figure: ranks down, time across; two rows per rank, "host" (tid 0) and "GPU"
(tid 1), each call a horizontal bar (broken_barh) coloured by route (the route table's
order, base/routes.def, then routes it does not know, e.g. fusion, by name), with a
legend. Bars keep a hairline outline, so calls too short for a pixel still show.
Nonblocking calls' host spans (the posting only) are drawn lighter. The time axis is
in µs, ms or s, whichever fits the window. The title names the file (after --title,
if given), the number of ranks and any dropped events.

--start and --end (µs, the file's time base) limit the window; a call is kept when its
span overlaps it. --summary prints, instead of plotting, one line per rank and route:
the number of host calls, their total host time (µs) and the number of GPU spans,
then the same summed over ranks; the window applies.

Exit status 0; 2 with a message when the file is not a streamcoll timeline (not
JSON, no otherData.streamcoll == "timeline", no traceEvents list, a malformed span)
or the options are bad. Events on other tids are left out, with a warning.

Needs matplotlib for the figure (Debian: python3-matplotlib, hence /usr/bin/python3
above; --summary does not need it); the Agg backend is used, so no display is needed.
"""

import argparse
import collections
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from route_names import route_names  # noqa: E402

HOST, GPU = 0, 1
# The route table's order when route_names.py finds no table (colours only).
FALLBACK_ROUTES = ("pmpi", "nccl", "ht", "blueconnect", "nvgroup", "ccube")


class InputError(Exception):
    """Not a streamcoll timeline: the message is for the user, the exit status is 2."""


# One span: rank, row (HOST or GPU), begin and length (µs), route, coll, seq,
# nonblocking (host spans; False for GPU spans).
Span = collections.namedtuple("Span", "rank row ts dur route coll seq nonblocking")

Timeline = collections.namedtuple(
    "Timeline", "path ranks dropped capacity spans names skipped")


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def route_from_name(name):
    """"allreduce nccl" -> "nccl"; the last word of the event's name."""
    words = str(name).split()
    return words[-1] if len(words) > 1 else ""


def load(path):
    """The Timeline in `path`; raises InputError when it is not a streamcoll timeline."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}")
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not JSON ({e}): not a streamcoll timeline")
    other = doc.get("otherData") if isinstance(doc, dict) else None
    if not isinstance(other, dict) or other.get("streamcoll") != "timeline":
        raise InputError(f"{path}: not a streamcoll timeline (no otherData.streamcoll == "
                         "\"timeline\"; is it STREAMCOLL_TIMELINE's output?)")
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise InputError(f"{path}: traceEvents is missing or not a list")
    ranks = other.get("ranks")
    if not _int(ranks) or ranks < 0:
        raise InputError(f"{path}: otherData.ranks is not a count: {ranks!r}")
    dropped = other.get("dropped", 0)
    capacity = other.get("capacity")
    dropped = dropped if _int(dropped) else 0
    capacity = capacity if _int(capacity) else None

    names = {}  # rank -> process_name
    hosts = []  # (index, event) of host spans
    gpus = []
    skipped = 0
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise InputError(f"{path}: traceEvents[{i}] is not an object")
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "process_name" and _int(e.get("pid")):
                label = (e.get("args") or {}).get("name")
                if isinstance(label, str):
                    names[e["pid"]] = label
            continue
        if ph != "X":
            skipped += 1
            continue
        for key in ("pid", "tid"):
            if not _int(e.get(key)):
                raise InputError(f"{path}: traceEvents[{i}]: {key} is not an integer: "
                                 f"{e.get(key)!r}")
        for key in ("ts", "dur"):
            if not _number(e.get(key)):
                raise InputError(f"{path}: traceEvents[{i}]: {key} is not a number: "
                                 f"{e.get(key)!r}")
        if e["pid"] < 0:
            raise InputError(f"{path}: traceEvents[{i}]: pid {e['pid']} is not a rank")
        if e["tid"] == HOST:
            hosts.append(e)
        elif e["tid"] == GPU:
            gpus.append(e)
        else:
            skipped += 1

    spans = []
    by_seq = {}  # (rank, seq) -> host span's route
    for e in hosts:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        route = str(args.get("route") or e.get("cat") or route_from_name(e.get("name"))
                    or "unknown")
        coll = str(args.get("coll") or str(e.get("name", "?")).split(" ")[0] or "?")
        seq = args.get("seq") if _int(args.get("seq")) else None
        spans.append(Span(e["pid"], HOST, float(e["ts"]), max(float(e["dur"]), 0.0),
                          route, coll, seq, args.get("nonblocking") is True))
        if seq is not None:
            by_seq[(e["pid"], seq)] = (route, coll)
    for e in gpus:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        seq = args.get("seq") if _int(args.get("seq")) else None
        route, coll = by_seq.get((e["pid"], seq), (None, None))
        route = route or str(e.get("cat") or route_from_name(e.get("name")) or "unknown")
        coll = coll or str(e.get("name", "?")).split(" ")[0] or "?"
        spans.append(Span(e["pid"], GPU, float(e["ts"]), max(float(e["dur"]), 0.0),
                          route, coll, seq, False))
    rank_list = sorted(set(range(ranks)) | {s.rank for s in spans})
    return Timeline(path, rank_list, dropped, capacity, spans, names, skipped)


def window(spans, start, end):
    """The spans overlapping [start, end] (either may be None: open)."""
    return [s for s in spans
            if (start is None or s.ts + s.dur >= start) and (end is None or s.ts <= end)]


def route_order(routes):
    """Routes in the route table's order, then the ones it does not know, by name."""
    try:
        known = route_names()
    except (OSError, SystemExit):  # a copy with neither base/routes.def nor routes.txt
        known = FALLBACK_ROUTES
    return sorted(routes, key=lambda r: (known.index(r) if r in known else len(known), r))

# --- --summary -------------------------------------------------------------------------


def summary(tl, spans, out=sys.stdout):
    rows = collections.defaultdict(lambda: [0, 0.0, 0])  # (rank, route) -> calls, µs, gpu
    for s in spans:
        row = rows[(s.rank, s.route)]
        if s.row == HOST:
            row[0] += 1
            row[1] += s.dur
        else:
            row[2] += 1
    extra = f", capacity {tl.capacity}" if tl.capacity is not None else ""
    print(f"{tl.path}: {len(tl.ranks)} ranks, {len(spans)} spans, "
          f"dropped {tl.dropped}{extra}", file=out)
    if not rows:
        print("no calls", file=out)
        return
    routes = route_order({r for _, r in rows})
    width = max(len("route"), *(len(r) for r in routes))
    print(f"{'rank':>5}  {'route':<{width}}  {'calls':>7}  {'host_us':>14}  "
          f"{'gpu_spans':>9}", file=out)
    totals = collections.defaultdict(lambda: [0, 0.0, 0])
    for rank in tl.ranks:
        for route in routes:
            if (rank, route) in rows:
                calls, us, gpu = rows[(rank, route)]
                print(f"{rank:>5}  {route:<{width}}  {calls:>7}  {us:>14.3f}  {gpu:>9}",
                      file=out)
                t = totals[route]
                t[0] += calls
                t[1] += us
                t[2] += gpu
    for route in routes:
        calls, us, gpu = totals[route]
        print(f"{'all':>5}  {route:<{width}}  {calls:>7}  {us:>14.3f}  {gpu:>9}", file=out)

# --- the figure ------------------------------------------------------------------------


def time_unit(span_us):
    """(label, divisor) for an axis spanning `span_us` microseconds."""
    if span_us >= 1e7:
        return "s", 1e6
    if span_us >= 2e3:
        return "ms", 1e3
    return "µs", 1.0


def plot(tl, spans, start, end, title, out_path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:  # pragma: no cover - depends on the machine
        sys.exit(f"plot_timeline.py: matplotlib is missing for {sys.executable} ({e}); "
                 "install python3-matplotlib or run the script with /usr/bin/python3")

    lo = start if start is not None else min([0.0] + [s.ts for s in spans])
    hi = end if end is not None else max([lo + 1.0] + [s.ts + s.dur for s in spans])
    if hi <= lo:
        hi = lo + 1.0
    unit, div = time_unit(hi - lo)

    routes = route_order({s.route for s in spans})
    if len(routes) <= 10:
        palette = list(plt.get_cmap("tab10").colors)
    else:  # tab20's strong colours first, then their light partners
        pairs = plt.get_cmap("tab20").colors
        palette = list(pairs[0::2]) + list(pairs[1::2])
    colors = {r: palette[i % len(palette)] for i, r in enumerate(routes)}

    nrows = 2 * len(tl.ranks)
    fig, ax = plt.subplots(figsize=(12, min(1.8 + 0.32 * nrows, 200.0)))
    where = {rank: 2 * i for i, rank in enumerate(tl.ranks)}
    groups = collections.defaultdict(list)  # (y, route, lighter) -> [(x, width)]
    for s in spans:
        y = where[s.rank] + s.row
        groups[(y, s.route, s.nonblocking)].append((s.ts / div, s.dur / div))
    for (y, route, light), bars in sorted(groups.items()):
        color = colors[route]
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolors=color,
                       linewidth=0.5, alpha=0.5 if light else 1.0)
    for i in range(len(tl.ranks)):
        if i % 2:
            ax.axhspan(2 * i - 0.5, 2 * i + 1.5, color="0.94", zorder=0)
        if i:
            ax.axhline(2 * i - 0.5, color="0.6", linewidth=0.6)
    ticks, labels = [], []
    for rank in tl.ranks:
        name = tl.names.get(rank, f"rank {rank}")
        ticks += [where[rank], where[rank] + 1]
        labels += [f"{name} host", "GPU"]
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8 if nrows <= 64 else 6)
    ax.set_ylim(nrows - 0.5, -0.5)  # rank 0's host row on top
    ax.set_xlim(lo / div, hi / div)
    ax.set_xlabel(f"time ({unit}; 0 = the earliest event)")
    ax.grid(axis="x", color="0.85", linewidth=0.6)
    ax.set_axisbelow(True)

    heading = f"{os.path.basename(tl.path)}: {len(tl.ranks)} ranks"
    if start is not None or end is not None:
        heading += f", {lo / div:g} to {hi / div:g} {unit}"
    if tl.dropped:
        heading += f", {tl.dropped} events dropped (capacity {tl.capacity})"
    if not spans:
        heading += ", no calls" + (" in the window" if start is not None or end is not None
                                   else "")
    ax.set_title((title + "\n" if title else "") + heading, fontsize=11)
    handles = [Patch(facecolor=colors[r], label=r) for r in routes]
    if any(s.nonblocking for s in spans):
        handles.append(Patch(facecolor="0.5", alpha=0.5, label="nonblocking\n(posting)"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0, title="route", fontsize=9, title_fontsize=9)
    fig.savefig(out_path, dpi=120, bbox_inches="tight")
    plt.close(fig)

# --- main ------------------------------------------------------------------------------


def main(argv):
    ap = argparse.ArgumentParser(
        description="Plot a streamcoll timeline (STREAMCOLL_TIMELINE): each rank's calls, "
                    "host and GPU rows, against time, coloured by route.")
    ap.add_argument("file", metavar="TIMELINE.json")
    ap.add_argument("-o", "--output", metavar="OUT.png", help="the figure to write")
    ap.add_argument("--start", type=float, metavar="US", help="window start (µs)")
    ap.add_argument("--end", type=float, metavar="US", help="window end (µs)")
    ap.add_argument("--title", help="a first title line")
    ap.add_argument("--summary", action="store_true",
                    help="print calls, host time and GPU spans per rank and route; no plot")
    args = ap.parse_args(argv)
    for name in ("start", "end"):
        v = getattr(args, name)
        if v is not None and not math.isfinite(v):
            print(f"plot_timeline.py: --{name} must be a number", file=sys.stderr)
            return 2
    if args.start is not None and args.end is not None and args.end <= args.start:
        print("plot_timeline.py: --end must be after --start", file=sys.stderr)
        return 2
    if not args.summary and not args.output:
        ap.print_usage(sys.stderr)
        print("plot_timeline.py: -o OUT.png is needed (or --summary)", file=sys.stderr)
        return 2
    try:
        tl = load(args.file)
    except InputError as e:
        print(f"plot_timeline.py: {e}", file=sys.stderr)
        return 2
    if tl.skipped:
        print(f"plot_timeline.py: {tl.skipped} events that are neither host nor GPU "
              "spans left out", file=sys.stderr)
    if tl.dropped:
        print(f"plot_timeline.py: warning: {tl.dropped} events were dropped when "
              f"recording (capacity {tl.capacity})", file=sys.stderr)
    spans = window(tl.spans, args.start, args.end)
    if args.summary:
        try:
            summary(tl, spans)
            sys.stdout.flush()
        except BrokenPipeError:  # `| head`
            sys.stderr.close()
        return 0
    try:
        plot(tl, spans, args.start, args.end, args.title, args.output)
    except OSError as e:
        print(f"plot_timeline.py: cannot write {e.filename or args.output}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 2
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
