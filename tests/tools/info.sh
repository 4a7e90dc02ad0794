#!/usr/bin/env bash
# streamcoll-info on this node (no GPU, no driver) and against the fake CUDA driver (two
# GPUs): exits 0, names every section, its JSON parses and holds what the text says (the
# environment's values, the table's rules after STREAMCOLL_ROUTE, a bad table file named
# with its line, the devices and their peer access), and a bad argument exits 2.
#   info.sh BUILD_DIR
set -euo pipefail
build=$1
info=$build/tools/streamcoll-info
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Text, MPI initialised (a singleton), no CUDA driver on the search path.
env -u LD_LIBRARY_PATH timeout 120 "$info" >"$tmp/text" 2>"$tmp/err" || { cat "$tmp/err"; fail "exit status"; }
for section in streamcoll: mpi: cuda: nccl: topology: "tuning table:" environment:; do
  grep -q "^$section" "$tmp/text" || fail "no section $section"
done
grep -q "thread level given: MPI_THREAD_" "$tmp/text" || fail "no thread level"
grep -q "source: embedded default" "$tmp/text" || fail "not the embedded table"
grep -q "STREAMCOLL_STATS: (unset; default 0)" "$tmp/text" || fail "no knob line"

# JSON, with settings, a forced route and a malformed table file; no MPI.
printf 'allreduce * * * * device * nccl\nbcast * * oops\n' >"$tmp/bad.table"
STREAMCOLL_STATS=1 STREAMCOLL_ROUTE=allreduce:ht:algo=rd STREAMCOLL_TUNING_FILE="$tmp/bad.table" \
  timeout 120 "$info" --json --no-mpi >"$tmp/json" || fail "--json exit status"
python3 - "$tmp/json" "$(dirname "$0")/../../scripts/route_names.py" <<'PY' || fail "JSON content"
import json, subprocess, sys
r = json.load(open(sys.argv[1]))
names = subprocess.run([sys.executable, sys.argv[2]], check=True, capture_output=True,
                       text=True).stdout.split()
for k in ["streamcoll", "mpi", "cuda", "nccl", "topology", "tuning table", "environment"]:
    assert k in r, k
assert r["streamcoll"]["version"], "version"
b = r["streamcoll"]
routes = b["routes built"]
assert {"pmpi", "ht", "blueconnect"} <= set(routes), routes
assert routes == [n for n in names if n in routes], ("not in the route table's order", routes, names)
assert ("nccl" in routes) == b["nccl header"], routes
assert ("nvgroup" in routes) == b["nvgroup kernels"], routes
assert ("ccube" in routes) == (b["nccl header"] and b["nvgroup kernels"]), routes
assert r["mpi"]["initialised"] is False, "--no-mpi"
env = {e["name"]: e["value"] for e in r["environment"]}
assert env["STREAMCOLL_STATS"] == "1" and env["STREAMCOLL_DEBUG"] is None, env
effect = {e["name"]: (e["in effect"], e["agreed"]) for e in r["environment"]}
assert effect["STREAMCOLL_STATS"] == ("1", "value"), effect
assert effect["STREAMCOLL_DEBUG"] == ("none", "local"), effect
assert effect["STREAMCOLL_ROUTE"] == ("allreduce:ht:algo=rd", "table"), effect
t = r["tuning table"]
assert "bad.table:2:" in t["source"] and "embedded default" in t["source"], t["source"]
assert t["rules"][0] == "allreduce * * * * * * ht algo=rd", t["rules"]
assert t["rules"][1].startswith("allreduce,reduce,bcast"), t["rules"]
assert isinstance(r["topology"].get("cores", 1), (int, float)), r["topology"]
PY

# --routes: the route table as Markdown, the routes that scripts/route_names.py reads.
timeout 60 "$info" --routes | sed -n 's/^| `\([a-z]*\)` |.*/\1/p' >"$tmp/routes" || fail "--routes exit status"
python3 "$(dirname "$0")/../../scripts/route_names.py" >"$tmp/names" || fail "route_names.py"
[ -s "$tmp/routes" ] && cmp -s "$tmp/routes" "$tmp/names" ||
  { paste "$tmp/routes" "$tmp/names"; fail "--routes and route_names.py name other routes"; }

# Against the fake driver: two GPUs, peer access between them.
if [ -e "$build/tests/fake/cuda/libcuda.so.1" ]; then
  LD_LIBRARY_PATH="$build/tests/fake/cuda" FAKE_CUDA_DEVICES=2 FAKE_CUDA_BUS_ID=same \
    timeout 120 "$info" --json --no-mpi >"$tmp/fake" || fail "fake driver: exit status"
  python3 - "$tmp/fake" <<'PY' || fail "fake driver: devices"
import json, sys
c = json.load(open(sys.argv[1]))["cuda"]
assert c["driver usable"] is True, c
d = c["devices"]
assert [x["name"] for x in d] == ["Fake GPU 0", "Fake GPU 1"], d
assert [x["pci bus id"] for x in d] == ["0000:01:00.0", "0000:02:00.0"], d
assert d[0]["memory bytes"] == 80 * 2**30, d
assert c["peer access"] == ["-1", "1-"], c
PY
fi

# Under mpirun, 3 ranks with one fake GPU each (CUDA_VISIBLE_DEVICES isolation): rank 0
# prints the node's reach matrix, the peers' GPUs reached through CUDA IPC where the node's
# topology gives peer access (all pairs; then bus 1-2 only).
if [ -e "$build/tests/fake/cuda/libcuda.so.1" ]; then
  source "$(dirname "$0")/../../scripts/mpi-launcher.sh"
  mpi_launcher "$(mpi_flavor_of "$build")"
  for peers in all 1,2/3; do
    LD_LIBRARY_PATH="$build/tests/fake/cuda" FAKE_CUDA_DEVICES=1 FAKE_CUDA_BUS_ID=per-rank \
      FAKE_CUDA_PEERS=$peers timeout 120 "$mpirun" "${mpirun_args[@]}" -np 3 "$info" --json \
      >"$tmp/node" 2>"$tmp/node.err" || { cat "$tmp/node.err"; fail "3 ranks, peers $peers: exit status"; }
    python3 - "$tmp/node" "$peers" <<'PY' || fail "3 ranks, peers $peers: the node's reach matrix"
import json, sys
text, docs, i = open(sys.argv[1]).read(), [], 0
dec = json.JSONDecoder()
while i < len(text):
    if text[i].isspace():
        i += 1
        continue
    doc, i = dec.raw_decode(text, i)
    docs.append(doc)
assert len(docs) == 1, len(docs)  # rank 0's
want = {"all": ["=II", "I=I", "II="], "1,2/3": ["=Ix", "I=x", "xx="]}[sys.argv[2]]
for d in docs:
    n = d["node gpus"]
    assert n["ranks on this node"] == 3, n
    assert n["gpu of each local rank"] == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"], n
    m = [v for k, v in n.items() if k.startswith("reach")][0]
    assert m == want, (m, want)
print("node gpus:", sys.argv[2], want)
PY
  done
fi

set +e
"$info" --bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "a bad argument does not exit 2"
echo "streamcoll-info: 1 passed, 0 failed"
