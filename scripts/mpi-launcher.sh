# Sourced (bash) by every script that starts MPI ranks: the one place that knows the
# launchers. Installed beside the autotuner as share/streamcoll/mpi-launcher.sh.
#
#   mpi_launcher [FLAVOR]
#       FLAVOR: the MPI the programs are built for, openmpi or mpich (mpi_flavor_of);
#       empty: the system's default MPI. Sets
#         mpirun        $MPIRUN, else FLAVOR's own launcher where installed
#                       (mpirun.openmpi, mpiexec.mpich: Debian installs both side by
#                       side), else mpirun
#         mpirun_kind   openmpi, hydra (MPICH's mpiexec) or other
#         mpirun_args   what every start here needs: Open MPI's --oversubscribe
#                       --bind-to none (ranks may outnumber cores), --allow-run-as-root
#                       as root
#       and, for Open MPI, exports OMPI_MCA_btl_vader_single_copy_mechanism=none (no
#       CMA in containers) unless already set.
#       With STREAMCOLL_CLUSTER set (scripts/cluster.sh run: the test cluster's state
#       folder), mpirun_args also spread the ranks over the cluster's nodes: its hostfile,
#       its launcher agent in ssh's place, its network only (Open MPI: plm_rsh_agent, btl
#       self,vader,tcp on the cluster's subnet, IPv4 only, every connection made in
#       MPI_Init; Hydra: -launcher-exec, -iface, UCX on that interface, with its shared
#       memory: with TCP and self alone, 3-rank runs of a two-line program hung in
#       MPI_Finalize in 7 of 8 tries (the rank on node2 in ucp_worker_progress, the others
#       in the PMI barrier: UCX's TCP transport hanging at cleanup, openucx/ucx#8738).
#       UCX's shared memory reaches across the nodes' namespaces (one machine), so MPICH's
#       ranks talk through it everywhere: 16 MiB allreduced over 3 ranks put 8 KB on
#       node2's link; under MPICH the cluster's node layout is real, its links are not;
#       UCX_TLS=tcp,self from the caller puts MPICH on the links, finalize hangs and all).
#       Why, for Open MPI
#       4.1's TCP BTL: runs printed "failed to TCP connect to a peer MPI process ...
#       connect() to 10.199.0.1:1024 failed ... Your job may now hang or fail" (under
#       fake-ht-np3 and fake-failures-bc-nccl-np4), preconnected or not. Its verbose log
#       shows each rank listening on IPv4 and IPv6, and neither rank of node1 got IPv4
#       port 1024 (another socket held it, an IPv6 one, which takes both families, the
#       likely holder), while a peer connected there. btl_tcp_disable_family 6 keeps the BTL to
#       IPv4: the message has not come back since (two runs of those tests).
#       mpi_preconnect_mpi=1 makes the connections while one thread runs.
#       STREAMCOLL_PROGRESS_BIND defaults to none on the test cluster, and when it has
#       more slots than this machine has cores, Open MPI also gets mpi_yield_when_idle 1
#       (below).
#   mpi_pass VAR...
#       sets mpirun_pass: the arguments that hand these environment variables to ranks on
#       other nodes (-x VAR each for Open MPI; -genvall for Hydra: its whole environment,
#       which Hydra hands on by default anyway). Ranks on the node of mpirun get its whole
#       environment from either. On the test cluster every exported variable goes too
#       (its agent starts each node's daemon with a fresh environment, as sshd does).
#       Not Hydra's -genvlist: MPICH 4.0.2's dropped a variable of its list now and then
#       on the other node (of A,B,C,D,E it dropped E in 5 of 5 runs on the test cluster,
#       of A,B,C once in 3; -genvall and the default passed all of them in every run), so
#       a rank there ran stream-attr-linked-np3 as if without streamcoll.
#   mpi_flavor_of DIR
#       prints the MPI a build folder or an installation prefix is for (the mpi variable
#       of its streamcoll.pc), or nothing.

mpi_flavor_of() {
  local pc
  for pc in "$1/meson-private/streamcoll.pc" "$1"/lib/*/pkgconfig/streamcoll.pc \
            "$1"/lib*/pkgconfig/streamcoll.pc; do
    if [ -r "$pc" ]; then
      sed -n 's/^mpi=//p' "$pc"
      return 0
    fi
  done
}

mpi_launcher() {
  local flavor=${1:-} own=mpirun
  case $flavor in
    openmpi) own=mpirun.openmpi ;;
    mpich) own=mpiexec.mpich ;;
  esac
  command -v "$own" >/dev/null 2>&1 || own=mpirun
  mpirun=${MPIRUN:-$own}
  mpirun_args=()
  # (Open MPI's launcher names itself "Open MPI" or, called as mpirun.openmpi, "OpenRTE".)
  local version
  version=$("$mpirun" --version 2>&1 || true)
  case $version in
    *"Open MPI"* | *OpenRTE*)
      mpirun_kind=openmpi
      mpirun_args=(--oversubscribe --bind-to none)
      [ "$(id -u)" -eq 0 ] && mpirun_args+=(--allow-run-as-root)
      export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
      ;;
    *HYDRA* | *Hydra*) mpirun_kind=hydra ;;
    *) mpirun_kind=other ;;
  esac
  local c=${STREAMCOLL_CLUSTER:-}
  if [ -n "$c" ]; then
    [ -r "$c/hosts.openmpi" ] && [ -x "$c/agent" ] ||
      { echo "mpi-launcher: STREAMCOLL_CLUSTER=$c is not a running test cluster (scripts/cluster.sh)" >&2; return 1; }
    local subnet slots
    subnet=$(cat "$c/subnet")
    # The simulated nodes share this machine's cores, which each node's MPI cannot see.
    # Progress threads stay unbound on every test cluster: each node's local rank 0 would
    # bind to the same core, whatever the machine's core count. With more slots than
    # cores, Open MPI also idles politely (mpi_yield_when_idle, what its mpirun sets by
    # itself on one oversubscribed node). Without both, a 2 x 2 cluster on 2 cores
    # starved runnable threads for up to 61 s and fake-ht-np3 took 536-855 s (15 s on
    # one node); with both, 85 s (bench/results/cluster_suite_2026-11-27b). The caller's
    # own settings win.
    export STREAMCOLL_PROGRESS_BIND=${STREAMCOLL_PROGRESS_BIND:-none}
    slots=$(( $(cat "$c/nodes") * $(cat "$c/ppn") ))
    if [ "$slots" -gt "$(nproc)" ] && [ "$mpirun_kind" = openmpi ] &&
       [ -z "${OMPI_MCA_mpi_yield_when_idle:-}" ]; then
      mpirun_args+=(--mca mpi_yield_when_idle 1)
    fi
    case $mpirun_kind in
      openmpi)
        mpirun_args+=(--hostfile "$c/hosts.openmpi" --mca plm_rsh_agent "$c/agent"
                      --mca plm_rsh_no_tree_spawn 1 --mca btl self,vader,tcp
                      --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet"
                      --mca mpi_preconnect_mpi 1 --mca btl_tcp_disable_family 6) ;;
      hydra)
        mpirun_args+=(-f "$c/hosts.hydra" -launcher ssh -launcher-exec "$c/agent" -iface eth0
                      -genv UCX_NET_DEVICES eth0 -genv UCX_TLS "${UCX_TLS:-tcp,self,sm}") ;;
      *) echo "mpi-launcher: the test cluster needs Open MPI or MPICH's Hydra ($mpirun)" >&2; return 1 ;;
    esac
  fi
  return 0
}

mpi_pass() {
  mpirun_pass=()
  if [ -n "${STREAMCOLL_CLUSTER:-}" ]; then  # everything exported, as Hydra does by default
    set -- "$@" $(compgen -e | grep -v -x -E 'PWD|OLDPWD|SHLVL|_|HOSTNAME|BASH_FUNC_.*' || true)
  fi
  [ $# -gt 0 ] || return 0
  case $mpirun_kind in
    openmpi)
      local v
      for v in "$@"; do mpirun_pass+=(-x "$v"); done
      ;;
    hydra) mpirun_pass=(-genvall) ;;
  esac
  return 0
}
