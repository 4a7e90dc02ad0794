#!/usr/bin/env bash
# Memory checking of the ht route on host buffers: host_routes under valgrind or ASan.
#
#   tests/mpi/asan_valgrind.sh valgrind BUILD_DIR [NP] [host_routes args...]
#       Runs BUILD_DIR/tests/host_routes_linked (linked with libstreamcoll, so nothing is
#       preloaded into mpirun or valgrind itself) on NP ranks (default 2) under
#       valgrind --error-exitcode=1 --leak-check=full, with Open MPI's own suppressions
#       and generated ones: leaks whose allocating frame lies in Open MPI, PMIx, hwloc or
#       libevent, or that were made inside ompi_mpi_init, orte_init, orte_finalize or Open
#       MPI's libevent threads (what those keep until exit is not streamcoll's), and the
#       uninitialised padding PMIx writes to its sockets. Everything else is reported.
#       Default host_routes args: --density=1 (every collective, algorithm, datatype and
#       op once).
#   tests/mpi/asan_valgrind.sh asan BUILD_DIR [NP] [host_routes args...]
#       BUILD_DIR configured with `meson setup BUILD_DIR -Db_sanitize=address`: runs
#       BUILD_DIR/tests/host_routes_plain with libasan and BUILD_DIR/libstreamcoll.so
#       preloaded (ASAN_OPTIONS=detect_leaks=0: Open MPI's exit-time allocations drown
#       LeakSanitizer; valgrind mode checks leaks). Default NP 3.
#
# Not a meson test: valgrind on oversubscribed ranks takes minutes. Logs (one per rank for
# valgrind) go to ${HR_LOG_DIR:-/tmp/host_routes_memcheck}.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:?usage: asan_valgrind.sh valgrind|asan BUILD_DIR [NP] [ARGS...]}
build=$(cd "${2:?build directory}" && pwd)
shift 2
np=${1:-}
[[ -n $np ]] && shift
logs=${HR_LOG_DIR:-/tmp/host_routes_memcheck}
mkdir -p "$logs"
# Without yielding, busy-polling ranks and progress threads starve each other on few cores.
export OMPI_MCA_mpi_yield_when_idle=1

case $mode in
  valgrind)
    np=${np:-2}
    [[ $# -gt 0 ]] || set -- --density=1
    supp=$logs/generated.supp
    : >"$supp"
    i=0
    # A leak is Open MPI's when the allocator's caller is in one of its libraries, or a
    # libc function (strdup, asprintf, ...) one or two frames below one of them. Never
    # "..." before such a frame: every stack ends in libc and main's callers.
    for lib in '*/libmpi.so*' '*/libopen-pal.so*' '*/libopen-rte.so*' '*/openmpi/mca_*' \
               '*/libpmix.so*' '*/pmix/*' '*/libhwloc.so*' '*/libevent*' '*/libudev.so*' \
               '*/libnl-*' '*/libibverbs.so*' '*/libfabric.so*' '*/libucs.so*' '*/libucp.so*' \
               '*/libuct.so*' '*/libz.so*'; do
      for alloc in malloc calloc realloc posix_memalign; do
        for libc_frames in 0 1 2; do
          i=$((i + 1))
          {
            printf '{\n  ompi-leak-%d\n  Memcheck:Leak\n  match-leak-kinds: all\n  fun:%s\n' "$i" "$alloc"
            for ((k = 0; k < libc_frames; ++k)); do printf '  obj:*/libc.so*\n'; done
            printf '  obj:%s\n}\n' "$lib"
          } >>"$supp"
        done
      done
    done
    # Components Open MPI unloads before exit leave their frames unnamed (???): anchor on
    # the Open MPI function below them. Not ompi_mpi_finalize: streamcoll's attribute
    # callbacks run inside it.
    for fn in ompi_mpi_init orte_init orte_finalize mca_base_component_repository_open \
              ompi_op_base_op_select event_base_loop hwloc_topology_load; do
      i=$((i + 1))
      printf '{\n  ompi-leak-%d\n  Memcheck:Leak\n  match-leak-kinds: all\n  ...\n  fun:%s\n}\n' "$i" "$fn" >>"$supp"
    done
    # Uninitialised bytes Open MPI and PMIx send in their own messages (padding).
    for call in 'writev(vector[...])' 'sendmsg(msg.msg_iov[0])' 'write(buf)' 'send(msg)'; do
      for lib in '*/openmpi/mca_*' '*/libopen-pal.so*' '*/libpmix.so*' '*/pmix/*' '*/libmpi.so*'; do
        i=$((i + 1))
        printf '{\n  ompi-param-%d\n  Memcheck:Param\n  %s\n  ...\n  obj:%s\n}\n' "$i" "$call" "$lib" >>"$supp"
      done
    done
    vg=(valgrind --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,possible
        --errors-for-leak-kinds=definite,possible --num-callers=30 --fair-sched=yes
        --suppressions="$supp" --log-file="$logs/valgrind.%q{OMPI_COMM_WORLD_RANK}.log")
    ompi_supp=/usr/share/openmpi/openmpi-valgrind.supp
    [[ -f $ompi_supp ]] && vg+=(--suppressions="$ompi_supp")
    rc=0
    "$here/run.sh" linked "$np" "${vg[@]}" "$build/tests/host_routes_linked" "$@" || rc=$?
    for f in "$logs"/valgrind.*.log; do
      echo "== $f: $(grep -E 'ERROR SUMMARY' "$f" | tail -1)"
      grep -E 'definitely lost:|possibly lost:' "$f" || true
    done
    exit "$rc"
    ;;
  asan)
    np=${np:-3}
    asan=$(gcc -print-file-name=libasan.so)
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} STREAMCOLL_LIB="$asan:$build/libstreamcoll.so" \
      "$here/run.sh" preload "$np" "$build/tests/host_routes_plain" "$@"
    ;;
  *)
    echo "unknown mode $mode (valgrind or asan)" >&2
    exit 2
    ;;
esac
