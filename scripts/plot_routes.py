#!/usr/bin/python3
"""Plots sc_bench timings: the fastest route per point, and latency per route.

Usage:
  scripts/plot_routes.py [--tie 0.05] [--title T] [--out-dir DIR] [--prefix NAME] FILE.csv...
  scripts/plot_routes.py --self-test [--out-dir DIR]

Input: one or more CSV files as bench/sc_bench --csv writes them (config/bench_csv.hpp).
Columns are found by name, so extra columns and any order are accepted; blank lines,
'#' comments and repeated header lines (runs appended to one file) are skipped. Rows
are left out (and counted) when: valid != 1; spec is "table" (nothing forced, so no
route to credit); the taken route is not the forced route's family (taken is not "-"
and is not the first word of route: the route declined and the time is another
route's); bytes is 0 (no place on a log axis); the median is not a positive number; or
the collective, memory kind or route family is one the tuning table does not know.

Rows are grouped by shape, as the table builder groups them: collective, memory kind,
stream attribute, and node class (one node, or more than one). For each shape:

  PREFIX-map-SHAPE.png      The fastest route per (ranks, size), after the Aluminum
                            paper's Fig. 10: x is the message size (log2, binary units),
                            y is each measured rank count, and each measured point is a
                            cell coloured by its winning route (the `route` column text,
                            e.g. "ht algo=rd"). Cells reach halfway (geometrically) to the
                            next measured size, which is where the table builder puts the
                            boundary. A hatched cell is a tie: a faster route was within
                            the tie margin and lost to the simpler one. Blank: not measured.
  PREFIX-latency-SHAPE.png  Median latency (log scale) against size (log2) for every
                            route, one panel per rank count, with the min..max over the
                            timed iterations as a shaded band (an error bar where a route
                            has one size only). Axis labels are times (µs, ms, s).

SHAPE is COLL-MEM-stream|nostream|anystream-singlenode|multinode (anystream: stream -1,
sc_model's predictions), e.g.
"allreduce-device-stream-singlenode". Routes keep one colour across all figures of a run.

Winner rule (config/table_builder.hpp, pick_winner): among the routes within --tie
(relative) of the fastest median (median <= fastest * (1 + tie)), the simplest wins.
Simplicity: the route family's rank (its place in the route table, base/routes.def:
pmpi 0, nccl 1, ht 2, ...) times 100 plus the number of parameters; equal simplicity goes to the route
seen first in the input. When a route was measured more than once at a point (several
files), its fastest median counts (this picks the same winner as keeping every row).

Output: the files written, one per line, after a line counting the rows used and left
out. Exit status 0; 2 with a message on bad input (unreadable file, missing column, bad
value, no usable rows).

--self-test builds synthetic CSVs in a temporary directory (three routes with known
crossovers at two rank counts, one tie, rows that must be left out, and a multi-node
shape in a second file with other column order), checks the winners the selection
picks against the known ones, writes the figures and checks they are PNGs. With
--out-dir the figures stay there; otherwise the temporary directory is removed. Exit
status 0 when every check passes, 1 otherwise.

Needs matplotlib (Debian: python3-matplotlib, hence /usr/bin/python3 above); the Agg
backend is used, so no display is needed.
"""

import argparse
import collections
import csv
import math
import os
import random
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from route_names import route_names  # noqa: E402

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, NullFormatter
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.exit(f"plot_routes.py: matplotlib is missing for {sys.executable} ({e}); "
             "install python3-matplotlib or run the script with /usr/bin/python3")

# --- the CSV ---------------------------------------------------------------------------

# Simplicity order of the route families (config/table_builder.hpp, simplicity()): the
# route table's order (route_names.py).
FAMILIES = tuple(route_names())
# What the tuning table knows (config/tuning_table.hpp).
COLLS = ("allreduce", "reduce", "bcast", "allgather", "allgatherv", "reduce_scatter",
         "reduce_scatter_block", "alltoall", "barrier")
MEMS = ("host", "pinned", "device", "managed")
# The columns this script reads (the CSV has more; see config/bench_csv.hpp).
INT_COLUMNS = ("stream", "ranks", "nodes", "ppn", "bytes")
FLOAT_COLUMNS = ("min_us", "median_us", "max_us")
TEXT_COLUMNS = ("coll", "mem", "spec", "route", "taken", "valid")
REQUIRED = TEXT_COLUMNS + INT_COLUMNS + FLOAT_COLUMNS

# Why a row was left out, in the order they are checked and reported.
SKIP_REASONS = (
    ("burst", "bursts of MPI_Iallreduce (sc_bench --burst: fusion)"),
    ("invalid", "valid != 1"),
    ("table", 'spec "table"'),
    ("declined", "taken route is not the forced one"),
    ("zero", "bytes 0"),
    ("time", "median not a positive number"),
    ("unknown", "collective, memory kind or route the table does not know"),
)


class InputError(Exception):
    """Bad input: the message is for the user, the exit status is 2."""


Shape = collections.namedtuple("Shape", "coll mem stream multi_node")

# One usable measurement. `order` is its place in the input (first seen).
Point = collections.namedtuple(
    "Point", "shape ranks nodes ppn bytes route median min max order")


# stream column -> (file name part, title part); -1 is sc_model's "either".
STREAM_NAMES = {1: ("stream", "stream"), 0: ("nostream", "no stream"),
                -1: ("anystream", "stream or not")}


def shape_name(shape):
    return "-".join((shape.coll, shape.mem,
                     STREAM_NAMES[shape.stream][0],
                     "multinode" if shape.multi_node else "singlenode"))


def shape_title(shape):
    return (f"{shape.coll}, {shape.mem} memory, "
            f"{STREAM_NAMES[shape.stream][1]}, "
            f"{'multi-node' if shape.multi_node else 'single node'}")


def route_family(route):
    words = route.split()
    return words[0] if words else ""


def simplicity(route):
    """Lower is simpler: family rank * 100 + number of parameters (as the table builder)."""
    words = route.split()
    family = words[0] if words else ""
    rank = FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)
    return rank * 100 + max(len(words) - 1, 0)


def pick_winner(candidates, tie):
    """Index of the winner among `candidates`, a list of (route, time) in first-seen
    order: the simplest of those within `tie` (relative) of the fastest; equal
    simplicity goes to the earlier one. -1 for an empty list."""
    if not candidates:
        return -1
    best = min(t for _, t in candidates)
    limit = best * (1.0 + tie) * (1.0 + 1e-12)  # equal but for rounding: a tie at tie 0
    tied = [i for i, (_, t) in enumerate(candidates) if t <= limit]
    return min(tied, key=lambda i: (simplicity(candidates[i][0]), i))


def read_csv(path, order_start, skipped):
    """The usable Points of one file (left-out rows are counted in `skipped`).
    Raises InputError on an unreadable file, a missing column or a bad value."""
    try:
        with open(path, newline="") as f:
            lines = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: cannot read: {e}")
    # Blank lines and '#' comments are skipped, as config/bench_csv.cpp does.
    lines = [(n, row) for n, row in enumerate(lines, 1)
             if any(c.strip() for c in row) and not row[0].startswith("#")]
    if not lines:
        raise InputError(f"{path}: empty file (no header)")
    _, header = lines[0]
    index = {name.strip(): i for i, name in enumerate(header)}
    missing = [c for c in REQUIRED if c not in index]
    if missing:
        raise InputError(f"{path}: missing columns: {', '.join(missing)} "
                         "(not an sc_bench CSV? see config/bench_csv.hpp)")
    points = []
    rows = 0
    for n, row in lines[1:]:
        if row == header:  # a header repeated by appending runs to one file
            continue
        rows += 1
        if len(row) < len(header):
            raise InputError(f"{path}:{n}: {len(row)} fields, the header has {len(header)}")
        v = {c: row[index[c]].strip() for c in REQUIRED}
        try:
            for c in INT_COLUMNS:
                v[c] = int(v[c])
            for c in FLOAT_COLUMNS:
                v[c] = float(v[c])
        except ValueError:
            bad = next(c for c in INT_COLUMNS + FLOAT_COLUMNS if isinstance(v[c], str))
            raise InputError(f"{path}:{n}: bad value for {bad}: {v[bad]!r}")
        route = " ".join(v["route"].split())
        family = route_family(route)
        if "burst" in index and row[index["burst"]].strip() not in ("", "0"):
            reason = "burst"  # bursts of MPI_Iallreduce (fusion): per-call times of another kind
        elif v["valid"] != "1":
            reason = "invalid"
        elif v["spec"] == "table" or route == "table":
            reason = "table"
        elif v["taken"] != "-" and v["taken"] != family:
            reason = "declined"
        elif v["bytes"] <= 0:
            reason = "zero"
        elif not (math.isfinite(v["median_us"]) and v["median_us"] > 0):
            reason = "time"
        elif v["coll"] not in COLLS or v["mem"] not in MEMS or family not in FAMILIES:
            reason = "unknown"
        else:
            reason = None
        if reason:
            skipped[reason] += 1
            continue
        shape = Shape(v["coll"], v["mem"], max(-1, min(1, v["stream"])), v["nodes"] > 1)
        med = v["median_us"]
        lo = v["min_us"] if math.isfinite(v["min_us"]) and v["min_us"] > 0 else med
        hi = v["max_us"] if math.isfinite(v["max_us"]) and v["max_us"] > 0 else med
        points.append(Point(shape, v["ranks"], v["nodes"], v["ppn"], v["bytes"], route,
                            med, min(lo, med), max(hi, med), order_start + len(points)))
    return points, rows


def read_inputs(paths):
    """All usable Points of `paths`, the number of rows and the left-out counts."""
    points, rows, skipped = [], 0, collections.Counter()
    for path in paths:
        got, n = read_csv(path, len(points), skipped)
        points += got
        rows += n
    return points, rows, skipped


def by_shape(points):
    """{shape: {(ranks, bytes): [Point, ...]}}; each route once per point (its fastest
    median), the lists in first-seen order. Also returns the number of rows merged."""
    best = {}
    for p in points:
        key = (p.shape, p.ranks, p.bytes, p.route)
        old = best.get(key)
        if old is None:
            best[key] = p
        elif p.median < old.median:
            best[key] = p._replace(order=old.order)
    shapes = collections.defaultdict(lambda: collections.defaultdict(list))
    for p in sorted(best.values(), key=lambda p: p.order):
        shapes[p.shape][(p.ranks, p.bytes)].append(p)
    return shapes, len(points) - len(best)


def winners(grid, tie):
    """{(ranks, bytes): (winning route, tie)} for one shape's grid; `tie` is True when a
    faster route lost to a simpler one within the margin."""
    out = {}
    for key, cands in grid.items():
        w = cands[pick_winner([(p.route, p.median) for p in cands], tie)]
        out[key] = (w.route, w.median > min(p.median for p in cands))
    return out

# --- the figures -----------------------------------------------------------------------


def size_label(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            v = b / (1 << shift)
            return f"{v:g} {unit}"
    return f"{b:g} B"


def time_label(us):
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if us >= scale:
            return f"{us / scale:g} {unit}"
    return f"{us:g} µs"


class TimeLogFormatter(LogFormatter):
    """Log-axis labels as times ("20 µs", "1.5 ms"); LogFormatter decides which ticks
    get one (decades, and some minor ticks when the axis spans little)."""

    def _num_to_string(self, x, vmin, vmax):
        return time_label(x)


def size_axis(ax, sizes, log2_coords):
    """Ticks at powers of 2 covering `sizes`, labelled with binary units; at most 16
    labels (every 2nd, 5th or 10th power when there are more), a minor tick at every
    power of 2. With `log2_coords` the axis data are log2(bytes), else bytes on a log2
    scale."""
    lo = math.floor(math.log2(min(sizes)))
    hi = math.ceil(math.log2(max(sizes)))
    step = next(s for s in (1, 2, 5, 10, 20) if (hi - lo) // s + 1 <= 16)
    major = [e for e in range(lo, hi + 1) if e % step == 0]
    minor = list(range(lo, hi + 1))
    if log2_coords:
        ax.xaxis.set_major_locator(FixedLocator(major))
        ax.xaxis.set_minor_locator(FixedLocator(minor))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(2.0 ** x)))
    else:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator([2.0 ** e for e in major]))
        ax.xaxis.set_minor_locator(FixedLocator([2.0 ** e for e in minor]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    for label in ax.get_xticklabels():
        label.set_rotation(45)
        label.set_horizontalalignment("right")


def route_colors(points):
    """One colour per route, by simplicity then first seen, the same in every figure."""
    first = {}
    for p in sorted(points, key=lambda p: p.order):
        first.setdefault(p.route, len(first))
    routes = sorted(first, key=lambda r: (simplicity(r), first[r]))
    if len(routes) <= 10:
        palette = list(plt.get_cmap("tab10").colors)
    else:  # tab20's strong colours first, then their light partners
        pairs = plt.get_cmap("tab20").colors
        palette = list(pairs[0::2]) + list(pairs[1::2])
    return {r: palette[i % len(palette)] for i, r in enumerate(routes)}


def layout_label(grid, ranks):
    """" (2x8)" (nodes x ppn) when rank count `ranks` spans nodes in one way, else ""."""
    layouts = {(p.nodes, p.ppn) for (r, _), ps in grid.items() if r == ranks for p in ps}
    if len(layouts) == 1:
        nodes, ppn = layouts.pop()
        if nodes > 1:
            return f" ({nodes}x{ppn})"
    return ""


def plot_map(shape, grid, wins, colors, tie, title, path):
    rank_counts = sorted({r for r, _ in grid})
    all_sizes = sorted({b for _, b in grid})
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.55 * len(rank_counts)))
    used, hatched, edges = set(), False, []
    for y, ranks in enumerate(rank_counts):
        sizes = sorted(b for r, b in grid if r == ranks)
        xs = [math.log2(b) for b in sizes]
        # Cell edges: the geometric midpoints between measured sizes (the table
        # builder's boundary); the end cells are as wide as their neighbour's half.
        mids = [(a + b) / 2 for a, b in zip(xs, xs[1:])]
        half = (xs[1] - xs[0]) / 2 if len(xs) > 1 else 0.5
        lefts = [xs[0] - half] + mids
        rights = mids + [xs[-1] + ((xs[-1] - xs[-2]) / 2 if len(xs) > 1 else 0.5)]
        edges += [lefts[0], rights[-1]]
        for b, left, right in zip(sizes, lefts, rights):
            route, is_tie = wins[(ranks, b)]
            used.add(route)
            ax.barh(y, right - left, left=left, height=0.9, color=colors[route],
                    edgecolor="white", linewidth=0.6)
            if is_tie:
                hatched = True
                ax.barh(y, right - left, left=left, height=0.9, facecolor="none",
                        edgecolor=(0, 0, 0, 0.45), hatch="///", linewidth=0)
    ax.set_yticks(range(len(rank_counts)))
    ax.set_yticklabels([f"{r}{layout_label(grid, r)}" for r in rank_counts])
    ax.set_ylim(-0.6, len(rank_counts) - 0.4)
    size_axis(ax, all_sizes, log2_coords=True)
    ax.set_xlim(min(edges), max(edges))
    ax.set_xlabel("message size (bytes, CallKey convention)")
    ax.set_ylabel("ranks" + (" (nodes x ppn)" if shape.multi_node else ""))
    ax.set_title((title + "\n" if title else "") +
                 f"Fastest route: {shape_title(shape)}", fontsize=11)
    handles = [Patch(facecolor=colors[r], label=r)
               for r in sorted(used, key=lambda r: (simplicity(r), r))]
    if hatched:
        handles.append(Patch(facecolor="white", edgecolor=(0, 0, 0, 0.45), hatch="///",
                             label=f"tie within {tie:g}: simpler\nroute chosen"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0, title="winner", fontsize=9, title_fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_latency(shape, grid, colors, title, path):
    rank_counts = sorted({r for r, _ in grid})
    all_sizes = sorted({b for _, b in grid})
    ncols = min(len(rank_counts), 3)
    nrows = math.ceil(len(rank_counts) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.9 * nrows),
                             squeeze=False)
    shown = []
    for i, ranks in enumerate(rank_counts):
        ax = axes[i // ncols][i % ncols]
        series = collections.defaultdict(list)
        for (r, _), ps in grid.items():
            if r == ranks:
                for p in ps:
                    series[p.route].append(p)
        for route in sorted(series, key=lambda r: (simplicity(r), r)):
            ps = sorted(series[route], key=lambda p: p.bytes)
            xs = [p.bytes for p in ps]
            if len(ps) > 1:
                ax.fill_between(xs, [p.min for p in ps], [p.max for p in ps],
                                color=colors[route], alpha=0.22, linewidth=0)
            else:  # one size: the band would be invisible, so an error bar
                p = ps[0]
                ax.errorbar(xs, [p.median], yerr=[[p.median - p.min], [p.max - p.median]],
                            color=colors[route], alpha=0.5, capsize=3, linewidth=1)
            ax.plot(xs, [p.median for p in ps], color=colors[route], marker="o",
                    markersize=2.5, linewidth=1.3, label=route)
            if route not in shown:
                shown.append(route)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(TimeLogFormatter(labelOnlyBase=True))
        ax.yaxis.set_minor_formatter(TimeLogFormatter(labelOnlyBase=False))
        size_axis(ax, all_sizes, log2_coords=False)
        ax.set_xlim(min(all_sizes) / 1.3, max(all_sizes) * 1.3)
        ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
        ax.set_title(f"{ranks} ranks{layout_label(grid, ranks)}", fontsize=10)
        ax.set_xlabel("message size")
        ax.set_ylabel("median latency")
    for j in range(len(rank_counts), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.suptitle((title + "\n" if title else "") +
                 f"Latency per route: {shape_title(shape)} (band: min..max)", fontsize=11)
    fig.tight_layout()
    shown.sort(key=lambda r: (simplicity(r), r))
    handles = [plt.Line2D([], [], color=colors[r], marker="o", markersize=3, label=r)
               for r in shown]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.93),
               title="route", fontsize=9, title_fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)

# --- the whole run ---------------------------------------------------------------------


def run(paths, tie, title, out_dir, prefix, log=print):
    """Reads, selects and plots; returns (written paths, {shape: winners}).
    Raises InputError on bad input."""
    points, rows, skipped = read_inputs(paths)
    left_out = sum(skipped.values())
    detail = ", ".join(f"{skipped[k]} {text}" for k, text in SKIP_REASONS if skipped[k])
    log(f"read {rows} rows from {len(paths)} file(s): {len(points)} used, "
        f"{left_out} left out" + (f" ({detail})" if detail else ""))
    if not points:
        raise InputError("no usable rows")
    shapes, merged = by_shape(points)
    if merged:
        log(f"{merged} repeated (shape, ranks, bytes, route) rows: the fastest median kept")
    colors = route_colors(points)
    os.makedirs(out_dir, exist_ok=True)
    written, all_wins = [], {}
    for shape in sorted(shapes):
        grid = shapes[shape]
        wins = winners(grid, tie)
        all_wins[shape] = wins
        name = shape_name(shape)
        path = os.path.join(out_dir, f"{prefix}-map-{name}.png")
        plot_map(shape, grid, wins, colors, tie, title, path)
        written.append(path)
        path = os.path.join(out_dir, f"{prefix}-latency-{name}.png")
        plot_latency(shape, grid, colors, title, path)
        written.append(path)
    return written, all_wins

# --- self-test -------------------------------------------------------------------------


HEADER = ("coll,dtype,op,mem,stream,ranks,nodes,ppn,spec,route,taken,bytes,count,iters,"
          "min_us,median_us,max_us,host_us,algbw_GBps,busbw_GBps,valid").split(",")


def synthetic_time(route, ranks, b):
    """Made-up alpha-beta latencies (us) with crossovers: ht algo=rd wins small sizes,
    pmpi the middle, nccl large ones (single node); pmpi then blueconnect (multi-node)."""
    lg = math.log2(ranks)
    if route == "ht algo=rd":
        return 2.5 * lg + b * lg / 1500
    if route == "pmpi" and ranks <= 8:
        return 6 * lg + 2 * b * (ranks - 1) / ranks / 3000
    if route == "nccl":
        return 30 + 2 * b * (ranks - 1) / ranks / 20000
    if route == "pmpi":
        return (20 + b / 2000) * lg / 4
    if route == "blueconnect hierarchy=2x8":
        return (60 + b / 8000) * lg / 4
    raise ValueError(route)


def synthetic_row(rng, coll, mem, stream, ranks, nodes, ppn, route, b, median=None,
                  taken=None, valid=1, spec=None):
    med = synthetic_time(route, ranks, b) if median is None else median
    family = route.split()[0]
    if spec is None:
        spec = family + "".join(":" + kv for kv in route.split()[1:])
    bus = 2 * (ranks - 1) / ranks
    return {"coll": coll, "dtype": "float", "op": "sum", "mem": mem, "stream": stream,
            "ranks": ranks, "nodes": nodes, "ppn": ppn, "spec": spec, "route": route,
            "taken": family if taken is None else taken, "bytes": b, "count": b // 4,
            "iters": 20, "min_us": f"{med * rng.uniform(0.9, 0.98):.3f}",
            "median_us": f"{med:.3f}", "max_us": f"{med * rng.uniform(1.05, 1.4):.3f}",
            "host_us": f"{med:.3f}", "algbw_GBps": f"{b / med / 1e3:.3f}",
            "busbw_GBps": f"{b / med / 1e3 * bus:.3f}", "valid": valid}


def write_csv(path, header, rows, mode="w"):
    with open(path, mode, newline="") as f:
        if mode == "a":
            f.write("# appended run\n")
        w = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def png_size(path):
    """(width, height) of a PNG file, or None when it is not one."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def self_test(out_dir):
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    # The rule itself.
    check(simplicity("pmpi") == 0 and simplicity("ht algo=rd") == 201 and
          simplicity("blueconnect hierarchy=2x2 algo=ring") == 302 and
          simplicity("nccl") < simplicity("ht"), "simplicity order and parameter count")
    check(pick_winner([("ht algo=rd", 1.0), ("pmpi", 1.04), ("nccl", 2.0)], 0.05) == 1,
          "tie: pmpi 4 % slower than ht wins at tie 0.05")
    check(pick_winner([("ht algo=rd", 1.0), ("pmpi", 1.04)], 0.0) == 0,
          "no tie at tie 0: the fastest wins")
    check(pick_winner([("ht algo=rd", 1.0), ("pmpi", 1.06)], 0.05) == 0,
          "pmpi 6 % slower than ht loses at tie 0.05")
    check(pick_winner([("ht algo=ring", 1.01), ("ht algo=rd", 1.0)], 0.05) == 0,
          "equal simplicity: the first seen wins")
    check(pick_winner([], 0.05) == -1, "no candidates: -1")

    rng = random.Random(7)
    tmp = tempfile.TemporaryDirectory(prefix="plot_routes-")
    single = [("allreduce", "device", 1, r, 1, r) for r in (4, 8)]
    sizes = [2 ** e for e in range(2, 31)]                    # 4 B .. 1 GiB
    rows1 = [synthetic_row(rng, *s, route, b) for s in single for b in sizes
             for route in ("pmpi", "nccl", "ht algo=rd")]
    # Rows that must be left out; each would win its point if it were used.
    rows2 = [synthetic_row(rng, *single[0], "nccl", 1024, median=0.5, valid=0),
             synthetic_row(rng, *single[0], "table", 1024, median=0.5, spec="table",
                           taken="nccl"),
             synthetic_row(rng, *single[0], "nccl", 4096, median=0.5, taken="pmpi")]
    # A multi-node shape in the second file; its taken column is "-" (no statistics).
    multi = [("allreduce", "device", 1, r, r // 8, 8) for r in (16, 32)]
    rows2 += [synthetic_row(rng, *s, route, 4 ** e, taken="-") for s in multi
              for e in range(5, 13) for route in ("pmpi", "blueconnect hierarchy=2x8")]
    csv1 = os.path.join(tmp.name, "single.csv")
    csv2 = os.path.join(tmp.name, "multi.csv")
    write_csv(csv1, HEADER, rows1[:40])  # two runs appended to one file
    write_csv(csv1, HEADER, rows1[40:], mode="a")
    # The second file has the burst column (sc_bench --burst rows: per-call times of
    # bursts, not single calls): a burst row far faster than anything must be left out.
    burst_row = dict(synthetic_row(rng, *multi[0], "pmpi", 4 ** 5, median=0.01, taken="-"),
                     burst=100)
    write_csv(csv2, ["note", "burst"] + HEADER[::-1],
              [dict(r, note="x", burst=0) for r in rows2] + [dict(burst_row, note="x")])

    # The known winners. Single node, both rank counts: ht algo=rd up to 4 KiB; at 8 KiB
    # on 4 ranks ht is fastest but pmpi is within 5 % (the tie: pmpi wins); nccl from
    # 64 KiB (4 ranks) or 32 KiB (8 ranks, 13 % ahead of pmpi). Multi-node: pmpi up to
    # 64 KiB, blueconnect from 256 KiB.
    def expected_single(ranks, b):
        if b <= 4096:
            return "ht algo=rd"
        return "pmpi" if b < (65536 if ranks == 4 else 32768) else "nccl"

    expect = {}
    for s in single:
        for b in sizes:
            expect[(Shape("allreduce", "device", 1, False), s[3], b)] = \
                expected_single(s[3], b)
    for s in multi:
        for e in range(5, 13):
            expect[(Shape("allreduce", "device", 1, True), s[3], 4 ** e)] = \
                "pmpi" if 4 ** e <= 65536 else "blueconnect hierarchy=2x8"
    tie_point = (Shape("allreduce", "device", 1, False), 4, 8192)
    check(synthetic_time("ht algo=rd", 4, 8192) < synthetic_time("pmpi", 4, 8192) <=
          1.05 * synthetic_time("ht algo=rd", 4, 8192),
          "synthetic data: ht fastest at 4 ranks, 8 KiB, pmpi within 5 %")

    dest = out_dir or os.path.join(tmp.name, "out")
    log = []
    try:
        written, wins = run([csv1, csv2], 0.05, "self-test", dest, "selftest", log.append)
    except InputError as e:
        check(False, f"run on synthetic data: {e}")
        tmp.cleanup()
        return 1
    print("\n".join("      " + line for line in log))
    check(log[0].startswith("read 210 rows from 2 file(s): 206 used, 4 left out "
                            "(1 bursts of MPI_Iallreduce (sc_bench --burst: fusion), "
                            '1 valid != 1, 1 spec "table", 1 taken route is not the '
                            "forced one)"), "rows and left-out rows counted by reason")
    check(sorted(wins) == sorted({k[0] for k in expect}), "two shapes (single, multi-node)")
    got = {(shape, r, b): route for shape, w in wins.items()
           for (r, b), (route, _) in w.items()}
    wrong = [f"{shape_name(k[0])} {k[1]} ranks {size_label(k[2])}: {got.get(k)} "
             f"(expected {v})" for k, v in expect.items() if got.get(k) != v]
    extra = sorted(set(got) - set(expect))
    check(not wrong and not extra, f"winners at all {len(expect)} points" +
          "".join("\n      " + w for w in wrong[:10]) + (f"\n      extra: {extra}"
                                                          if extra else ""))
    check(wins[tie_point[0]][tie_point[1:]] == ("pmpi", True),
          "tie point won by pmpi and marked a tie")
    check(len(written) == 4, "four figures written (map + latency for two shapes)")
    for path in written:
        dims = png_size(path) if os.path.exists(path) else None
        check(dims is not None and dims[0] >= 400 and dims[1] >= 200 and
              os.path.getsize(path) > 10000,
              f"valid PNG {os.path.basename(path)} {dims} "
              f"{os.path.getsize(path) if os.path.exists(path) else 0} bytes")

    # Bad input.
    bad = os.path.join(tmp.name, "bad.csv")
    with open(bad, "w") as f:
        f.write("coll,ranks,bytes,median_us\nallreduce,4,4,1.0\n")
    try:
        run([bad], 0.05, None, dest, "bad", lambda _: None)
        check(False, "missing columns rejected")
    except InputError as e:
        check("missing columns" in str(e), f"missing columns rejected: {e}")
    write_csv(bad, HEADER, rows2[:3])
    try:
        run([bad], 0.05, None, dest, "bad", lambda _: None)
        check(False, "no usable rows rejected")
    except InputError as e:
        check("no usable rows" in str(e), f"no usable rows rejected: {e}")

    tmp.cleanup()
    if out_dir:
        print(f"figures kept in {out_dir}")
    print("self-test: " + (f"FAILED ({len(failures)} checks)" if failures else "passed"))
    return 1 if failures else 0

# --- main ------------------------------------------------------------------------------


def main(argv):
    ap = argparse.ArgumentParser(
        description="Plot sc_bench CSVs: fastest route per (ranks, size) and latency "
                    "per route, one pair of PNGs per shape.")
    ap.add_argument("--tie", type=float, default=0.05,
                    help="relative margin within which the simpler route wins (0.05)")
    ap.add_argument("--title", help="a first title line on every figure")
    ap.add_argument("--out-dir", help="where the PNGs go (default: the current directory)")
    ap.add_argument("--prefix", default="routes", help="file name prefix (routes)")
    ap.add_argument("--self-test", action="store_true",
                    help="run the built-in checks on synthetic data")
    ap.add_argument("files", nargs="*", metavar="FILE.csv")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(args.out_dir)
    if not args.files:
        ap.print_usage(sys.stderr)
        print("plot_routes.py: no CSV files given", file=sys.stderr)
        return 2
    if not (math.isfinite(args.tie) and args.tie >= 0):
        print(f"plot_routes.py: --tie must be a number >= 0, not {args.tie}",
              file=sys.stderr)
        return 2
    if not args.prefix or os.sep in args.prefix:
        print("plot_routes.py: --prefix must be a non-empty file name part",
              file=sys.stderr)
        return 2
    try:
        written, _ = run(args.files, args.tie, args.title, args.out_dir or ".", args.prefix)
    except InputError as e:
        print(f"plot_routes.py: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
