#!/usr/bin/python3
"""The summary of a scripts/cluster-bench.sh run (its summary.txt).

Usage: scripts/cluster-summary.py OUT RATE...

For each rate, from OUT/RATE: the fitted profile's link levels (fit.txt), then per shape
(4 ranks: 2 nodes x 2; 8 ranks: 4 nodes x 2) the median time of every route at every
fourth size (autotune/measured.csv, and han.csv for Open MPI's han), the winner per size
(the fastest median; ties within 5 % to the simpler route, as the table builder does),
BlueConnect's time against the flat ring, recursive doubling, Open MPI's tuned and han at
each of those sizes, and the crossover lines of model.txt and predict-OTHER.txt (the
model fitted at RATE against the measurements at RATE and at the other rates).
"""

import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from route_names import route_names  # noqa: E402

TIE = 0.05
FAMILY_RANK = {name: i for i, name in enumerate(route_names())}  # the route table's order


def simplicity(route):
    words = route.split()
    return FAMILY_RANK.get(words[0], 9) * 100 + len(words) - 1


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{n} B"


def load(path):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for r in csv.DictReader(line for line in f if line.strip() and not line.startswith("#")):
            if r.get("coll") != "allreduce" or r.get("valid") != "1":
                continue
            family = r["route"].split()[0]
            if r["taken"] not in ("-", family):
                continue  # the route declined: the time is another route's
            rows.append(r)
    return rows


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, rates = sys.argv[1], sys.argv[2:]
    print("# streamcoll on the test cluster (scripts/cluster.sh): allreduce on host buffers")
    print(f"# scripts/cluster-summary.py {out} {' '.join(rates)}")
    for rate in rates:
        d = os.path.join(out, rate)
        print(f"\n## links at {rate} (tc tbf both ways)")
        status = os.path.join(out, f"cluster-{rate}.txt")
        if os.path.exists(status):
            for line in open(status):
                if line.startswith("#") or "round trip" in line:
                    print(line.rstrip())
        fit = os.path.join(d, "fit.txt")
        if os.path.exists(fit):
            for line in open(fit):
                if line.startswith("level"):
                    print("fit: " + line.rstrip())
        rows = load(os.path.join(d, "autotune", "measured.csv")) + load(os.path.join(d, "han.csv"))
        for ranks in sorted({int(r["ranks"]) for r in rows}):
            shape = [r for r in rows if int(r["ranks"]) == ranks and int(r["nodes"]) > 1]
            if not shape:
                continue
            nodes, ppn = shape[0]["nodes"], shape[0]["ppn"]
            routes = []
            for r in shape:
                if r["route"] not in routes:
                    routes.append(r["route"])
            t = {(r["route"], int(r["bytes"])): float(r["median_us"]) for r in shape}
            sizes = sorted({int(r["bytes"]) for r in shape})
            shown = [s for s in sizes if (s.bit_length() - 1) % 2 == 0 or s == sizes[-1]]
            print(f"\n### {rate}, {ranks} ranks: {nodes} nodes x {ppn} (median us; * the winner, "
                  f"ties within {TIE:.0%} to the simpler route)")
            width = max(12, max(len(x) for x in routes) + 1)
            print(f"{'bytes':>10}" + "".join(f"{x:>{width}}" for x in routes))
            for s in shown:
                have = [(x, t[(x, s)]) for x in routes if (x, s) in t]
                if not have:
                    continue
                best = min(v for _, v in have)
                near = [x for x, v in have if v <= best * (1 + TIE)]
                win = min(near, key=lambda x: (simplicity(x), routes.index(x)))
                cells = []
                for x in routes:
                    v = t.get((x, s))
                    cells.append(f"{'-' if v is None else f'{v:.0f}' + ('*' if x == win else ' '):>{width}}")
                print(f"{human(s):>10}" + "".join(cells))
            bc = "blueconnect backend=sched"
            others = [("ring", "ht algo=ring"), ("rd", "ht algo=rd"), ("tuned", "pmpi"), ("han", "pmpi han")]
            if any((bc, s) in t for s in sizes):
                print(f"BlueConnect (hierarchy {ppn}x{nodes}, found by the route) against: time ratio "
                      "(< 1: BlueConnect faster)")
                print(f"{'bytes':>10}" + "".join(f"{name:>10}" for name, _ in others))
                for s in shown:
                    if (bc, s) not in t:
                        continue
                    cells = [f"{t[(bc, s)] / t[(x, s)]:>10.2f}" if (x, s) in t else f"{'-':>10}" for _, x in others]
                    print(f"{human(s):>10}" + "".join(cells))
        for name in ["model.txt"] + [f"predict-{o}.txt" for o in rates if o != rate]:
            path = os.path.join(d, name)
            if not os.path.exists(path):
                continue
            what = ("the model fitted here, against these measurements" if name == "model.txt" else
                    f"the model fitted at {rate}, level 1 taken to {name[8:-4]}, against the measurements there")
            print(f"\n### crossovers: {what} ({rate}/{name})")
            for line in open(path):
                if re.match(r"^# \d+ ranks", line) or line.startswith("  ") or "crossovers matched" in line:
                    print(line.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
