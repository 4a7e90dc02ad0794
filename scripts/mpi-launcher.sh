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
#   mpi_pass VAR...
#       sets mpirun_pass: the arguments that hand these environment variables to ranks on
#       other nodes (-x VAR each for Open MPI, -genvlist for Hydra). Ranks on the node of
#       mpirun get its whole environment from either.
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
  return 0
}

mpi_pass() {
  mpirun_pass=()
  [ $# -gt 0 ] || return 0
  case $mpirun_kind in
    openmpi)
      local v
      for v in "$@"; do mpirun_pass+=(-x "$v"); done
      ;;
    hydra) mpirun_pass=(-genvlist "$(IFS=,; echo "$*")") ;;
  esac
  return 0
}
