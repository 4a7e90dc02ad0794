#!/usr/bin/env python3
"""The library's layers, checked at link level: no layer calls up.

meson builds one static library per layer (meson.build: `layer_libs`, bottom first:
base, config, core, algorithms, shim). tests/tools/check_layers.py checks the includes;
this checks the objects: every symbol a layer's objects use (nm: U) must be defined in
that layer, in a layer below it, or outside the library (libc, MPI, libstdc++). A symbol
used by a layer and defined only in a layer above it is an upward call that no include
shows (a declaration written by hand, an `extern`): an error.

    tests/tools/check_layer_links.py NM LAYER=ARCHIVE [LAYER=ARCHIVE ...]   (bottom first)
    tests/tools/check_layer_links.py NM --self-test CXX

Prints each upward call (layer: symbol -> layer that defines it) and exits 1, or a
summary line and exits 0. --self-test builds two one-file layers with CXX, one calling
the other down, then up, and checks that only the second is refused. Run by the meson
tests `layer-links` and `layer-links-self-test` (suite unit).
"""
import subprocess
import sys
import tempfile
from pathlib import Path

DEFINED = set("TDBRVWGSCiu")  # nm types of a symbol defined here (strong, weak, unique)


def symbols(nm: str, archive: str):
    """(defined, used) symbol sets of an archive's objects."""
    out = subprocess.run([nm, "-P", "-A", archive], check=True, capture_output=True,
                         text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        name, kind = fields[1], fields[2]
        if kind == "U":
            used.add(name)
        elif kind in DEFINED or kind.upper() in DEFINED:
            defined.add(name)
    return defined, used


def check(nm: str, layers) -> int:
    """layers: [(name, archive)], bottom first. Returns the number of upward calls."""
    tables = [(name, *symbols(nm, archive)) for name, archive in layers]
    upward = 0
    for i, (name, defined_i, used) in enumerate(tables):
        below = set(defined_i)
        for _, defined_j, _ in tables[:i]:
            below |= defined_j
        for sym in sorted(used - below):
            owners = [n for n, d, _ in tables[i + 1:] if sym in d]
            if owners:
                print(f"{name}: calls {sym} -> defined in {owners[0]} (a layer above)")
                upward += 1
    if upward == 0:
        print(f"layer links: {len(tables)} layers, "
              f"{sum(len(u) for _, _, u in tables)} used symbols, none calls up")
    return upward


def self_test(nm: str, cxx: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def archive(name, text):
            src, obj, lib = root / f"{name}.cpp", root / f"{name}.o", root / f"lib{name}.a"
            src.write_text(text)
            subprocess.run([cxx, "-c", "-fPIC", str(src), "-o", str(obj)], check=True)
            lib.unlink(missing_ok=True)
            subprocess.run(["ar", "rcs", str(lib), str(obj)], check=True)
            return str(lib)

        low = archive("low", "int low_fn(int x) { return x + 1; }\n")
        up = archive("up", "int low_fn(int); int up_fn(int x) { return low_fn(x) * 2; }\n")
        print("self-test: the upper layer calls the lower one:")
        if check(nm, [("low", low), ("up", up)]) != 0:
            print("self-test: FAIL: a downward call was refused")
            return 1
        low = archive("low", "int up_fn(int); int low_fn(int x) { return up_fn(x) + 1; }\n")
        print("self-test: the lower layer calls the upper one:")
        if check(nm, [("low", low), ("up", up)]) != 1:
            print("self-test: FAIL: the upward call low_fn -> up_fn was not reported")
            return 1
    print("self-test: passed")
    return 0


def main(argv) -> int:
    if len(argv) == 4 and argv[2] == "--self-test":
        return self_test(argv[1], argv[3])
    if len(argv) < 3:
        print(__doc__)
        return 2
    layers = [tuple(arg.split("=", 1)) for arg in argv[2:]]
    return 1 if check(argv[1], layers) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
