#!/usr/bin/env bash
# The multi-node smoke test (CI): a test cluster of 2 nodes (scripts/cluster.sh, its own
# namespaces, addresses and state folder, so a cluster someone runs by hand is left
# alone), 2 ranks per node under Open MPI, 1 under MPICH (whose ranks poll without
# yielding: 4 ranks on this machine's 2 cores take a scheduler slice, 4-8 ms, per step;
# docs/guide.md, "MPICH"), then, with the build's MPI:
#   - sc_bench on every rank: streamcoll finds 2 nodes and, with 2 ranks per node, the
#     hierarchy 2x2 (node x nodes) from the real layout (nothing imposed); pmpi, ht (rd,
#     ring) and, on that hierarchy, blueconnect each take their calls and give exact
#     results (--check all);
#   - traffic crosses the network: a 1 MiB bcast from node1 leaves through node1's shaped
#     link (its tc counters grow by at least the bytes sent), not through shared memory;
#   - the host-routes test: on 3 ranks under Open MPI (2 on node1, 1 on node2: an uneven
#     layout), on 2 under MPICH;
#   - the cluster taken down leaves nothing behind.
# Skips (77) when not root or without network namespaces.
#   smoke.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the test cluster needs root"; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "SKIP: no ip/tc (iproute2)"; exit 77; }
export STREAMCOLL_CLUSTER_STATE=/run/streamcoll-cluster-smoke STREAMCOLL_CLUSTER_PREFIX=scs-
export STREAMCOLL_CLUSTER_NET=10.198.0
cluster=$src/scripts/cluster.sh
source "$src/scripts/mpi-launcher.sh"
ppn=2 bc_route=(--route blueconnect:backend=sched) hr_np=3
if [ "$(mpi_flavor_of "$build")" = mpich ]; then
  ppn=1 bc_route=() hr_np=2
  # MPICH on the links, which the traffic check below is about: UCX without its shared
  # memory, which reaches across the simulated nodes (scripts/mpi-launcher.sh gives it
  # by default, for UCX's TCP transport hangs MPI_Finalize with ranks sharing a node;
  # with one rank per node, as here, it has not).
  export UCX_TLS=tcp,self
fi
np=$((2 * ppn))
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
if ! out=$("$cluster" up --nodes 2 --ppn $ppn --rate 1gbit 2>&1); then
  case $out in
    *"cannot create a network namespace"*) echo "SKIP: $out"; exit 77 ;;
  esac
  echo "$out"; fail "cluster.sh up"
fi
echo "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; "$cluster" down >/dev/null 2>&1 || true' EXIT
lib=$build/libstreamcoll.so
run=("$cluster" run --timeout 300 env STREAMCOLL_LIB="$lib" OMPI_MCA_mpi_yield_when_idle=1
     STREAMCOLL_THREAD_MULTIPLE=1 "$src/tests/mpi/run.sh")

# 1. The layout and the routes.
"${run[@]}" preload $np env STREAMCOLL_DEBUG=info "$build/bench/sc_bench" --coll allreduce -e 64K -n 5 \
  --check all --route pmpi --route ht:algo=rd --route ht:algo=ring "${bc_route[@]}" \
  --csv "$tmp/routes.csv" >"$tmp/routes.log" 2>&1 || { cat "$tmp/routes.log"; fail "sc_bench on the cluster"; }
grep -q "^# $np ranks, 2 node(s), at most $ppn per node" "$tmp/routes.log" ||
  { grep '^#' "$tmp/routes.log"; fail "sc_bench does not see $np ranks on 2 nodes"; }
if [ $ppn = 2 ]; then
  grep -q "info: hierarchy of 4 ranks: 2x2 (node x nodes)" "$tmp/routes.log" ||
    { grep 'hierarchy' "$tmp/routes.log"; fail "the hierarchy found is not 2x2 (node x nodes)"; }
fi
python3 - "$tmp/routes.csv" "$np" "$ppn" <<'PY' || fail "sc_bench's rows"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert rows, "no rows"
for r in rows:
    assert r["valid"] == "1", r
    assert r["taken"] == r["route"].split()[0], (r["route"], r["taken"])
    assert (r["ranks"], r["nodes"], r["ppn"]) == (sys.argv[2], "2", sys.argv[3]), r
routes = sorted({r["route"] for r in rows})
print(f"{len(rows)} rows ({', '.join(routes)}): every route took its calls, every result exact, 2 nodes")
PY

# 2. Cross-node traffic goes over the shaped link.
sent() { ip netns exec scs-node1 tc -s qdisc show dev eth0 | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p' | head -n 1; }
before=$(sent)
"${run[@]}" preload $np "$build/bench/sc_bench" --coll bcast -b 1M -e 1M -n 5 -w 1 --route pmpi \
  --csv "$tmp/bcast.csv" >"$tmp/bcast.log" 2>&1 || { cat "$tmp/bcast.log"; fail "bcast on the cluster"; }
after=$(sent)
calls=$(python3 -c 'import csv,sys; r=list(csv.DictReader(open(sys.argv[1])))[0]; print(int(r["iters"]) + 1)' "$tmp/bcast.csv")
[ $((after - before)) -ge $((calls * 1048576)) ] ||
  fail "node1's link carried $((after - before)) bytes for $calls bcasts of 1 MiB to node2 (shared memory across nodes?)"
echo "node1's link: $((after - before)) bytes for $calls bcasts of 1 MiB (at least one copy each crossed it)"

# 3. The host routes, on an uneven layout where there are slots for it.
"${run[@]}" preload $hr_np "$build/tests/host_routes_plain" >"$tmp/hr.log" 2>&1 ||
  { tail -n 30 "$tmp/hr.log"; fail "host_routes on $hr_np ranks of 2 nodes"; }
grep -E "passed, 0 failed" "$tmp/hr.log"

# 4. Nothing left behind.
"$cluster" down >/dev/null
left=$(ip netns list | grep -c '^scs-' || true)
[ "$left" = 0 ] && ! ls -d /etc/netns/scs-* >/dev/null 2>&1 && [ ! -e "$STREAMCOLL_CLUSTER_STATE" ] ||
  fail "cluster.sh down left namespaces ($left), /etc/netns entries or its state folder"
echo "PASS: cluster smoke"
