#!/usr/bin/env bash
# Runs one MPI test program under mpirun.
#   [VAR=VALUE ...] run.sh MODE NP PROGRAM [PROGRAM ARGS ...]
# MODE: preload  the program is not linked with streamcoll; LD_PRELOAD=$STREAMCOLL_LIB
#                (then $STREAMCOLL_TEST_PRELOAD, a test tool that wraps what streamcoll calls)
#       linked   the program is linked with libstreamcoll
#       quiet    as preload, without statistics (the paths a production job takes, such as
#                the steady path's inline form: shim/steady.hpp)
#       plain    no streamcoll at all (the reference)
# In preload and linked modes the program is told to prove interception through the
# statistics (STREAMCOLL_STATS=1, STREAMCOLL_EXPECT_INTERCEPT=1). The launcher is the one
# of the MPI the build folder of $STREAMCOLL_LIB is for, or $MPIRUN
# (scripts/mpi-launcher.sh). STREAMCOLL_RUN_TIMEOUT: the run's time limit in seconds
# (default 600; scripts/cluster-suite.sh raises it with meson's timeout multiplier).
set -euo pipefail
mode=$1 np=$2 prog=$3
shift 3
# shellcheck source=../../scripts/mpi-launcher.sh
source "$(dirname "$0")/../../scripts/mpi-launcher.sh"
mpi_launcher "$(mpi_flavor_of "$(dirname "$STREAMCOLL_LIB")")"
envs=()
[ "$mpirun_kind" = openmpi ] && envs+=(OMPI_MCA_rmaps_base_oversubscribe=1)
case $mode in
  preload) envs+=(LD_PRELOAD="$STREAMCOLL_LIB${STREAMCOLL_TEST_PRELOAD:+:$STREAMCOLL_TEST_PRELOAD}"
                  STREAMCOLL_STATS=1 STREAMCOLL_EXPECT_INTERCEPT=1) ;;
  linked) envs+=(STREAMCOLL_STATS=1 STREAMCOLL_EXPECT_INTERCEPT=1) ;;
  quiet) envs+=(LD_PRELOAD="$STREAMCOLL_LIB${STREAMCOLL_TEST_PRELOAD:+:$STREAMCOLL_TEST_PRELOAD}"
                STREAMCOLL_STATS=0) ;;
  plain) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
# Variables reach the ranks of mpirun's node through its environment (Open MPI and MPICH
# both forward it); on the test cluster mpi_pass hands them to the other nodes' ranks.
mpi_pass "${envs[@]%%=*}"  # for ranks on other nodes (scripts/cluster.sh)
exec env "${envs[@]}" timeout "${STREAMCOLL_RUN_TIMEOUT:-600}" "$mpirun" "${mpirun_args[@]}" "${mpirun_pass[@]}" -np "$np" "$prog" "$@"
