#!/bin/sh
# The test cluster's launcher agent (scripts/cluster.sh), in ssh's place:
#   cluster-agent.sh [SSH OPTIONS] HOST COMMAND [ARGS...]
# Open MPI (plm_rsh_agent) and MPICH's Hydra (-launcher ssh -launcher-exec) call it to
# start their daemon on HOST. It runs COMMAND as sshd would, through a shell, with the
# words joined by spaces and a fresh environment (HOME, USER, LOGNAME, SHELL, PATH), but
# inside HOST's network namespace and under HOST's hostname (a UTS namespace of its own,
# which every process the daemon starts shares). ssh options before HOST are skipped.
set -eu
while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;  # ssh options that take a value
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "cluster-agent: usage: cluster-agent.sh [ssh options] HOST COMMAND" >&2; exit 255; }
host=$1
shift
case $host in
  *[!A-Za-z0-9-]*) echo "cluster-agent: bad host name '$host'" >&2; exit 255 ;;
esac
ns=$(cat "$(dirname "$0")/prefix")$host  # the cluster's namespace prefix, beside this copy
ip netns list | grep -q "^$ns\b" || { echo "cluster-agent: no node $host (scripts/cluster.sh up)" >&2; exit 255; }
exec env -i HOME="${HOME:-/root}" USER="$(id -un)" LOGNAME="$(id -un)" SHELL=/bin/sh \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
