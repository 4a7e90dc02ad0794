#!/usr/bin/env bash
# A test cluster on this machine: N simulated nodes, each a Linux network namespace whose
# processes see their own hostname (a UTS namespace per launch), joined by veth pairs to a
# bridge in a namespace of its own, every link shaped with tc tbf. MPI sees N hosts:
# shared memory inside a node, TCP across. Nothing outside the namespaces is changed but
# /etc/netns/scc-* (each node's /etc/hosts) and the state folder; only the cluster's own
# addresses (10.199.0.0/24) are used. STREAMCOLL_CLUSTER_STATE, STREAMCOLL_CLUSTER_PREFIX
# and STREAMCOLL_CLUSTER_NET (below) place a second cluster beside it.
#
#   scripts/cluster.sh up [--nodes N] [--ppn K] [--rate RATE]   build it (tears down any
#                            earlier one first; N 2-8, default 2; K ranks per node, the
#                            hostfile's slots, default 2; RATE a tc rate, default 1gbit)
#   scripts/cluster.sh rate RATE          reshape every link (e.g. 1gbit, 10gbit)
#   scripts/cluster.sh run [--timeout S] CMD [ARGS...]
#                            run CMD on node1, the head node (mpirun starts there), with
#                            STREAMCOLL_CLUSTER set: scripts/mpi-launcher.sh then adds the
#                            hostfile, the launcher agent and the network settings, so
#                            every script that starts ranks spreads them over the nodes.
#                            Bounded by S seconds (default 3600); its exit status.
#   scripts/cluster.sh status             the nodes, addresses, link rates, round trip
#   scripts/cluster.sh down               remove everything (idempotent)
#
# Root only; refuses clearly when not root or when network namespaces are unavailable.
# The launcher agent (scripts/cluster-agent.sh) is what Open MPI (plm_rsh_agent) and
# MPICH's Hydra (-launcher-exec) call instead of ssh: it enters the node's namespace and
# runs the command there under the node's hostname, with a fresh environment as sshd
# would give (the MPI must pass the variables its ranks need, as on a real cluster).
# netem is not available here: a link's latency is the TCP path's own (`status`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Where the cluster lives: its state folder, the prefix of its namespaces' names, and its
# /24 (node K is NET.K). Several clusters can stand side by side (the CI smoke test uses
# its own) when all three differ.
state=${STREAMCOLL_CLUSTER_STATE:-/run/streamcoll-cluster}
prefix=${STREAMCOLL_CLUSTER_PREFIX:-scc-}
net=${STREAMCOLL_CLUSTER_NET:-10.199.0}
switch=${prefix}switch

die() { echo "cluster.sh: $*" >&2; exit 1; }
need_root() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, veth, tc)"
  command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null ||
    die "needs ip and tc (iproute2) and unshare (util-linux)"
}
nodes_up() { cat "$state/nodes" 2>/dev/null || echo 0; }

burst_for() {  # a tbf bucket of 0.2 ms at the rate (at least 64 KiB: a GSO packet)
  local rate=$1 bits
  case $rate in
    *gbit) bits=$(( ${rate%gbit} * 1000000000 )) ;;
    *mbit) bits=$(( ${rate%mbit} * 1000000 )) ;;
    *kbit) bits=$(( ${rate%kbit} * 1000 )) ;;
    *) die "rate '$rate': give it as Nkbit, Nmbit or Ngbit" ;;
  esac
  local b=$(( bits / 8 / 5000 ))
  [ $b -ge 65536 ] || b=65536
  echo $b
}

shape() {  # shape every link at $1, both directions (node egress, switch port egress)
  local rate=$1 n k burst
  burst=$(burst_for "$rate")
  n=$(nodes_up)
  for k in $(seq 1 "$n"); do
    ip netns exec "${prefix}node$k" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
    ip netns exec "$switch" tc qdisc replace dev "p$k" root tbf rate "$rate" burst "$burst" latency 100ms
  done
  echo "$rate" >"$state/rate"
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
  rm -rf /etc/netns/"$prefix"* "$state"
}

up() {
  local n=2 ppn=2 rate=1gbit
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) n=$2; shift ;;
      --ppn) ppn=$2; shift ;;
      --rate) rate=$2; shift ;;
      *) die "up: unknown option '$1'" ;;
    esac
    shift
  done
  case $n in [2-8]) ;; *) die "up: --nodes takes 2 to 8, got '$n'" ;; esac
  case $ppn in [1-9]) ;; *) die "up: --ppn takes 1 to 9, got '$ppn'" ;; esac
  burst_for "$rate" >/dev/null
  down
  ip netns add "$switch" 2>/dev/null ||
    die "cannot create a network namespace (ip netns add failed: no CAP_SYS_ADMIN, or no namespaces in this kernel)"
  mkdir -p "$state"
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  : >"$state/hosts.openmpi"
  : >"$state/hosts.hydra"
  local hosts="127.0.0.1 localhost"$'\n'
  for k in $(seq 1 "$n"); do
    hosts+="$net.$k node$k"$'\n'
    echo "node$k slots=$ppn" >>"$state/hosts.openmpi"
    echo "node$k:$ppn" >>"$state/hosts.hydra"
  done
  for k in $(seq 1 "$n"); do
    local ns=${prefix}node$k
    ip netns add "$ns"
    ip link add "${prefix}a$k" type veth peer name "${prefix}b$k"
    ip link set "${prefix}a$k" netns "$ns" name eth0
    ip link set "${prefix}b$k" netns "$switch" name "p$k"
    ip -n "$switch" link set "p$k" master br0 up
    ip -n "$ns" addr add "$net.$k/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts" >"/etc/netns/$ns/hosts"
  done
  echo "$n" >"$state/nodes"
  echo "$ppn" >"$state/ppn"
  echo "$net.0/24" >"$state/subnet"
  echo "$prefix" >"$state/prefix"
  cp "$here/cluster-agent.sh" "$state/agent"
  chmod +x "$state/agent"
  shape "$rate"
  # node1 reaches every other node before anyone relies on it.
  for k in $(seq 2 "$n"); do
    reaches "$net.$k" || { down; die "node1 cannot reach node$k"; }
  done
  echo "cluster: $n nodes x $ppn slots (node1..node$n, $net.1-$n), links $rate; state in $state"
}

# Whether node1 reaches ADDR: a TCP connection to a closed port is refused at once by a
# reachable host (no ping needed); an unreachable one times out.
reaches() {
  local out
  out=$(ip netns exec "${prefix}node1" timeout 3 bash -c "exec 3<>/dev/tcp/$1/9" 2>&1) && return 0
  case $out in *"Connection refused"*) return 0 ;; esac
  return 1
}

status() {
  local n k
  n=$(nodes_up)
  [ "$n" -gt 0 ] || { echo "cluster: down"; return 0; }
  echo "cluster: $n nodes x $(cat "$state/ppn") slots, links $(cat "$state/rate") (tc tbf, both directions)"
  for k in $(seq 1 "$n"); do
    echo "  node$k $net.$k"
  done
  if [ "$n" -ge 2 ] && command -v ping >/dev/null; then
    ip netns exec "${prefix}node1" ping -c 20 -i 0.01 -q "$net.2" 2>/dev/null |
      sed -n 's|^rtt min/avg/max/mdev = \(.*\) ms|  round trip node1-node2 (ICMP, 56 B): min/avg/max/mdev \1 ms|p'
  fi
}

# run on node1 with the node's hostname and STREAMCOLL_CLUSTER set
run() {
  local limit=3600
  if [ "${1:-}" = --timeout ]; then limit=$2; shift 2; fi
  [ $# -gt 0 ] || die "run: no command"
  [ "$(nodes_up)" -gt 0 ] || die "run: the cluster is down (scripts/cluster.sh up)"
  exec timeout --kill-after=10 "$limit" ip netns exec "${prefix}node1" \
    unshare --uts sh -c 'hostname node1 && exec "$@"' sh \
    env STREAMCOLL_CLUSTER="$state" "$@"
}

cmd=${1:-}
shift || true
case $cmd in
  up) need_root; up "$@" ;;
  down) need_root; down; echo "cluster: down" ;;
  rate) need_root; [ "$(nodes_up)" -gt 0 ] || die "rate: the cluster is down"; shape "${1:?rate RATE}";
        echo "cluster: links $1" ;;
  run) need_root; run "$@" ;;
  status) status ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; [ -z "$cmd" ] || exit 2 ;;
esac
