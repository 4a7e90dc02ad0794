#!/usr/bin/env python3
"""The library's folders are layers; a file includes headers of its own layer or below.

    shim, streamext   the MPI symbols: interception, dispatch, the stream attribute
    algorithms        the routes and their algorithms, fusion
    core              runtime, communicator contexts, agreement, requests, staging, driver
    config            environment, tuning table, cost model
    base              log, types, hierarchy shapes

An include of a folder above (`#include "algorithms/..."` in core/) is an error: a
lower layer reaches an upper one only through what the upper one registers with it
(core::Runtime::set_stop_hooks, host_staging::set_batch_copy_loader). The public header
(include/streamcoll/) may be included anywhere. Tests, benchmarks and tools are not
layers and may include anything.

Inside algorithms/, a route's files include another route's headers only where the route
is declared to build on it (ROUTE_USES: blueconnect runs its levels on ht, nvgroup and
nccl; ccube extends nccl's class; ...); the shared parts (the route interface, schedules,
the NCCL loader and maps, the kernels' logic) are everyone's.

    tests/tools/check_layers.py SOURCE_ROOT
    tests/tools/check_layers.py --self-test

Prints each offending include (file:line: what) and exits 1, or prints a summary line
and exits 0. --self-test checks the checker on a small tree of its own (one include
pointing up, one down, one to the public header). Run by the meson tests `layers` and
`layers-self-test` (suite unit).
"""
import re
import sys
import tempfile
from pathlib import Path

LAYERS = [  # bottom first
    ("base",),
    ("config",),
    ("core",),
    ("algorithms",),
    ("shim", "streamext"),
]
RANK = {folder: i for i, group in enumerate(LAYERS) for folder in group}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/([^"]+)"')
# The routes' files in algorithms/ (by file stem), and which routes each may build on. A
# route's own file, algorithms/<id>.cpp, is known from its row in base/routes.def
# (route_ids); ROUTE_FILES names its other files (and fusion's, which packs for routes).
# A route absent from ROUTE_USES builds on none.
ROUTE_FILES = {
    "pmpi": "pmpi", "nccl": "nccl", "nccl_comm": "nccl", "nccl_detail": "nccl",
    "nccl_enqueue": "nccl", "nccl_setup": "nccl", "ccube": "ccube", "ht": "ht",
    "ht_device": "ht", "ht_host": "ht", "ht_staged": "ht", "ht_stream": "ht",
    "blueconnect": "blueconnect", "blueconnect_comm": "blueconnect",
    "blueconnect_engine": "blueconnect", "blueconnect_gpu": "blueconnect", "nvgroup": "nvgroup",
    "nvgroup_group": "nvgroup", "nvgroup_launch": "nvgroup", "nvgroup_module": "nvgroup",
    "nvgroup_setup": "nvgroup", "fusion": "fusion",
    "fusion_queue": "fusion", "fusion_group": "fusion", "fusion_route": "fusion",
}
ROUTE_USES = {
    "pmpi": set(),
    "nccl": set(),
    "ccube": {"nccl", "nvgroup"},     # nccl's class and communicators, nvgroup's reduction kernel
    "ht": set(),
    "blueconnect": {"ht", "nvgroup", "nccl"},  # its levels' backends
    "nvgroup": set(),                 # (several groups: blueconnect, through find_route)
    "fusion": {"ht", "nccl"},         # ht's stream stages, nccl's GPU memory for packing
}
SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".c"}
ROUTE_ROW = re.compile(r"^ROUTE\((\w+),", re.MULTILINE)


def route_ids(root: Path) -> set:
    """The routes of base/routes.def (none when the tree has no such file)."""
    rows = root / "base" / "routes.def"
    return set(ROUTE_ROW.findall(rows.read_text())) if rows.is_file() else set()


def route_of(stem: str, routes: set):
    return ROUTE_FILES.get(stem) or (stem if stem in routes else None)


def self_test() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for group in LAYERS:
            for folder in group:
                (root / folder).mkdir()
        (root / "core" / "a.cpp").write_text('#include "base/log.hpp"\n#include "streamcoll/streamcoll.h"\n')
        (root / "core" / "b.hpp").write_text('#include <mpi.h>\n  #  include "algorithms/route.hpp"\n')
        print("self-test: a tree with one include pointing up:")
        if check(root) != 1:
            print("self-test: FAIL: the include of algorithms/ from core/ was not reported")
            return 1
        (root / "core" / "b.hpp").write_text('#include "config/env.hpp"\n')
        print("self-test: the same tree without it:")
        if check(root) != 0:
            print("self-test: FAIL: a tree whose includes all point down was refused")
            return 1
        (root / "algorithms" / "ht.cpp").write_text('#include "algorithms/schedule.hpp"\n'
                                                    '#include "algorithms/nccl_comm.hpp"\n')
        print("self-test: route ht including route nccl's header:")
        if check(root) != 1:
            print("self-test: FAIL: an undeclared route-to-route include was not reported")
            return 1
        (root / "algorithms" / "blueconnect.cpp").write_text('#include "algorithms/nccl_comm.hpp"\n')
        (root / "algorithms" / "ht.cpp").unlink()
        print("self-test: route blueconnect including route nccl's header (declared):")
        if check(root) != 0:
            print("self-test: FAIL: a declared route-to-route include was refused")
            return 1
        (root / "base" / "routes.def").write_text('ROUTE(stub, always, "a test route", {})\n')
        (root / "algorithms" / "stub.cpp").write_text('#include "algorithms/nccl_comm.hpp"\n')
        print("self-test: route stub, known only from its row in base/routes.def, including route nccl's header:")
        if check(root) != 1:
            print("self-test: FAIL: a route's include of another route went unseen when the route is only in base/routes.def")
            return 1
        (root / "algorithms" / "stub.cpp").write_text('#include "algorithms/route.hpp"\n')
    print("self-test: ok")
    return 0


def check(root: Path) -> int:
    errors, files, includes = [], 0, 0
    routes = route_ids(root)
    for folder, rank in sorted(RANK.items()):
        base = root / folder
        if not base.is_dir():
            errors.append(f"{folder}/: missing (the layer list in {Path(__file__).name} is stale)")
            continue
        for path in sorted(p for p in base.rglob("*") if p.suffix in SUFFIXES):
            files += 1
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) not in RANK:
                    continue
                includes += 1
                target = m.group(1)
                if RANK[target] > rank:
                    errors.append(
                        f"{path.relative_to(root)}:{n}: {folder}/ includes {target}/, a layer "
                        f"above it ({' > '.join('/'.join(g) for g in reversed(LAYERS))})")
                elif folder == target == "algorithms":
                    mine = route_of(path.stem, routes)
                    theirs = route_of(Path(m.group(2)).stem, routes)
                    if mine and theirs and mine != theirs and theirs not in ROUTE_USES.get(mine, set()):
                        errors.append(
                            f"{path.relative_to(root)}:{n}: route {mine} includes route "
                            f"{theirs}'s {m.group(2)}, which it is not declared to build on "
                            f"(ROUTE_USES in {Path(__file__).name})")
    for e in errors:
        print(e)
    if errors:
        print(f"layers: {len(errors)} include(s) point up or cross routes undeclared")
        return 1
    print(f"layers: {files} files, {includes} includes between layer folders, none points up; "
          "routes include only the routes they build on")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(self_test() if sys.argv[1] == "--self-test" else check(Path(sys.argv[1])))
