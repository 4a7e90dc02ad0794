#!/usr/bin/env python3
"""The routes' names, in streamcoll's order, for the scripts (plot_routes.py,
cluster-summary.py) so that none keeps its own list.

The list is read from its one source, the routes' rows (base/routes.def: one row per route,
`ROUTE(name, needs, ...`), when this script sits in the source tree; an installed copy
reads routes.txt beside it, which the build writes from the same rows:
    route_names.py base/routes.def routes.txt      (meson does this)
    route_names.py                                 (prints the names, one per line)
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = re.compile(r'^ROUTE\((\w+),', re.MULTILINE)


def from_source(path):
    with open(path, encoding="utf-8") as f:
        names = [m.group(1) for m in ROW.finditer(f.read())]
    if not names:
        sys.exit(f"route_names.py: no route rows in {path}")
    return names


def route_names():
    source = os.path.join(HERE, "..", "base", "routes.def")
    if os.path.exists(source):
        return from_source(source)
    with open(os.path.join(HERE, "routes.txt"), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


if __name__ == "__main__":
    if len(sys.argv) == 3:
        with open(sys.argv[2], "w", encoding="utf-8") as out:
            out.write("".join(n + "\n" for n in from_source(sys.argv[1])))
    elif len(sys.argv) == 1:
        print("\n".join(route_names()))
    else:
        sys.exit(__doc__)
