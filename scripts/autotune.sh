#!/usr/bin/env bash
# The autotuner: measures every candidate route on this machine and communicator shape
# with bench/sc_bench, writes the tuning table streamcoll loads (STREAMCOLL_TUNING_FILE),
# plots the fastest route per (ranks, size) and the latency curves, and checks that the
# table, loaded by streamcoll, routes every measured size as written.
#
#   scripts/autotune.sh [options]
#     --np "2 4 8"        rank counts to measure (default "2 4"); rules merge across them
#     --coll LIST         collectives, comma-separated (default allreduce)
#     --mem LIST          buffers: host, device or host,device (default host); device
#                         buffers need a GPU: without one they are skipped ("SKIP")
#     --stream no|yes|both  device buffers without / with the stream attribute attached,
#                         or both (default no; a bare --stream means yes)
#     --routes "R ..."    candidates in sc_bench --route syntax, for every memory kind
#                         (default: host "pmpi ht:algo=rd ht:algo=rabenseifner
#                         ht:algo=ring", ht:algo=ccube too for allreduce, without
#                         rabenseifner for allgather and
#                         reduce_scatter_block, where it is rd; device: the same and nccl,
#                         and for allreduce nvgroup and ccube where the build has the
#                         kernels: nvgroup declines communicators over several nodes,
#                         which sc_bench notes)
#     --min-bytes N --max-bytes N --iters N --warmup N   passed to sc_bench
#                         (defaults 4, 64M, sc_bench's own iteration counts)
#     --tie F             ties within F (relative) go to the simpler route (default 0.05)
#     --burst N           allreduce: also time bursts of N MPI_Iallreduce + MPI_Waitall
#                         (sc_bench --burst) of every candidate and of pmpi:fuse=FUSE,
#                         from --min-bytes to --burst-max-bytes; where the fused bursts
#                         are faster, the table's rule gets fuse=FUSE (Horovod's tensor
#                         fusion, docs/guide.md "Fusion"). Default 100; 0: no fusion measured.
#                         Not for device buffers with the stream attribute. On device
#                         buffers with STREAMCOLL_FUSION_NCCL=1 set, nccl:fuse=FUSE too
#                         (fused messages on NCCL, docs/guide.md "Fusion")
#     --fuse SIZE         the fused candidate's fuse= (default 64M, Horovod's threshold)
#     --burst-max-bytes N the largest burst size (default 64K)
#     --out DIR           where everything goes (default autotune-YYYYmmdd-HHMMSS)
#     --no-plot           no PNGs (they need python3-matplotlib)
#     --no-verify         do not run the check against the loaded table
#     --no-build          use the build folder as it is (the CI test does)
# Environment: BUILD_DIR (default build), MPIRUN (default: the launcher of the MPI the
# library is built for, mpirun.openmpi or mpiexec.mpich where those exist, else mpirun),
# MPIRUN_ARGS (extra
# arguments for every mpirun, e.g. "--hostfile hosts --map-by ppr:4:node"), PYTHON (a
# python3 with matplotlib, for the plots; default: python3, then /usr/bin/python3).
#
# Writes into DIR: measured.csv (every route at every size and rank count), table.txt
# (the tuning table), autotune-map-*.png and autotune-latency-*.png, verify.csv (sc_bench
# with nothing forced under STREAMCOLL_TUNING_FILE=table.txt, every call checked),
# profile.toml (a machine profile fitted to the ht allreduce rows, for
# build/bench/sc_model predict) and log.txt.
# Exit status: 0 done and verified; 1 a benchmark or the check failed; 2 bad usage;
# 77 nothing measured (only device buffers asked for, and no GPU).
set -euo pipefail
# Paths given by the caller (--out, host files in MPIRUN_ARGS) stay relative to where the
# script was started; a relative BUILD_DIR is relative to the source tree, as for
# scripts/build.sh.
root=$(cd "$(dirname "$0")/.." && pwd)
# `meson install` installs this script as bin/streamcoll-autotune with the line below
# filled in (the library directory, relative to the prefix): it then runs the installed
# tools beside it, builds nothing, and ignores BUILD_DIR. In the source tree it stays as is.
installed_libdir="@STREAMCOLL_LIBDIR@"
installed_mpi="@MPI@"  # the MPI it is built for
installed=1
case $installed_libdir in @*) installed=0 ;; esac

nps="2 4" colls=allreduce mems=host streams=no routes="" tie=0.05 out="" plot=1 verify=1 build_it=1
burst=100 fuse=64M burst_max=64K
bench_opts=()
while [ $# -gt 0 ]; do
  case $1 in
    --np) nps=$2; shift ;;
    --coll) colls=$2; shift ;;
    --mem) mems=$2; shift ;;
    --stream)
      case ${2:-} in no|yes|both) streams=$2; shift ;; *) streams=yes ;; esac ;;
    --routes) routes=$2; shift ;;
    --min-bytes|--max-bytes|--iters|--warmup) bench_opts+=("$1" "$2"); shift ;;
    --tie) tie=$2; shift ;;
    --burst) burst=$2; shift ;;
    --fuse) fuse=$2; shift ;;
    --burst-max-bytes) burst_max=$2; shift ;;
    --out) out=$2; shift ;;
    --no-plot) plot=0 ;;
    --no-verify) verify=0 ;;
    --no-build) build_it=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "autotune.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
# The shapes to measure: "MEM:STREAM" (STREAM 0 or 1).
shapes=()
for m in ${mems//,/ }; do
  case $m in
    host) shapes+=(host:0) ;;
    device)
      [ "$streams" != yes ] && shapes+=(device:0)
      [ "$streams" != no ] && shapes+=(device:1) ;;
    *) echo "autotune.sh: --mem takes host, device or host,device, got '$mems'" >&2; exit 2 ;;
  esac
done
[ ${#shapes[@]} -gt 0 ] || { echo "autotune.sh: --mem is empty" >&2; exit 2; }
[[ $burst =~ ^[0-9]+$ ]] || { echo "autotune.sh: --burst takes a count (0: none), got '$burst'" >&2; exit 2; }
[ "$streams" != no ] && [[ ,$mems, != *,device,* ]] &&
  { echo "autotune.sh: --stream is for device buffers (add --mem device)" >&2; exit 2; }
routes_for() {  # the candidates for memory kind $1 and collective $2
  if [ -n "$routes" ]; then echo "$routes"; return; fi
  local r="pmpi ht:algo=rd ht:algo=rabenseifner ht:algo=ring"
  # ht's rabenseifner is its rd for these two (algorithms/schedule.hpp): measuring both
  # would only let noise pick between one algorithm's two names
  case $2 in
    allgather|reduce_scatter_block) r="pmpi ht:algo=rd ht:algo=ring" ;;
    allreduce) r="$r ht:algo=ccube" ;;  # C-Cube's overlapped tree, its default chunk
  esac
  [ "$1" = device ] && r="nccl $r"
  # nvgroup, and ccube (C-Cube's tree on NCCL send/recv): both need the kernels' fatbin
  [ "$1" = device ] && [ "$2" = allreduce ] && [ $have_nvgroup = 1 ] && r="nvgroup ccube $r"
  echo "$r"
}
printf '%s' "${bench_opts[*]:-}" | grep -q -- '--max-bytes' || bench_opts+=(--max-bytes 64M)
out=${out:-autotune-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
case $out in /*) ;; *) out=$PWD/$out ;; esac  # ranks on other nodes get absolute paths
if [ $installed = 1 ]; then
  lib=$root/$installed_libdir/libstreamcoll.so
  sc_bench=$root/bin/sc_bench sc_tune=$root/bin/sc_tune sc_model=$root/bin/sc_model
  plot_py=$root/share/streamcoll/plot_routes.py
  have_nvgroup=0
  "$root/bin/streamcoll-info" --json --no-mpi 2>/dev/null | grep -q '"nvgroup kernels":true' && have_nvgroup=1
else
  build=${BUILD_DIR:-build}
  [ $build_it = 1 ] && "$root/scripts/build.sh" >/dev/null
  case $build in /*) ;; *) build=$root/$build ;; esac
  lib=$build/libstreamcoll.so
  sc_bench=$build/bench/sc_bench sc_tune=$build/bench/sc_tune sc_model=$build/bench/sc_model
  plot_py=$root/scripts/plot_routes.py
  have_nvgroup=0
  grep -q 'STREAMCOLL_HAVE_NVGROUP=1' "$build/build.ninja" && have_nvgroup=1
fi
for f in "$lib" "$sc_bench" "$sc_tune"; do
  [ -e "$f" ] || { echo "autotune.sh: $f is missing (build first, or drop --no-build)" >&2; exit 2; }
done

# The measurements force each route and the check loads the new table: routes forced or
# tables named from outside would only get in the way.
unset STREAMCOLL_ROUTE STREAMCOLL_TUNING_FILE STREAMCOLL_DISABLE
# The launcher of the MPI the library is built for (scripts/mpi-launcher.sh; installed:
# the flavor filled in above, and the helper beside the plotting script).
if [ $installed = 1 ]; then
  source "$root/share/streamcoll/mpi-launcher.sh"
  mpi_launcher "$installed_mpi"
else
  source "$root/scripts/mpi-launcher.sh"
  mpi_launcher "$(mpi_flavor_of "$build")"
fi
# ranks may outnumber cores here; a spinning waiter would starve the progress thread
[ "$mpirun_kind" = openmpi ] && export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
read -r -a extra <<<"${MPIRUN_ARGS:-}"
log=$out/log.txt
: >"$log"
say() { echo "$@" | tee -a "$log"; }
say "# scripts/autotune.sh: commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
say "# ranks: $nps; collectives: $colls; shapes (memory:stream): ${shapes[*]}; candidates: ${routes:-default per memory kind}"

# bench NP CSV ENV... -- SC_BENCH_ARGS...: one sc_bench run under streamcoll.
bench() {
  local np=$1 csv=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  envs=(LD_PRELOAD="$lib" STREAMCOLL_STATS=1 "${envs[@]}")
  # the variables for ranks on other nodes too
  mpi_pass "${envs[@]%%=*}" $(compgen -e | grep -E '^(STREAMCOLL_|NCCL_)' || true)
  local cmd=(env "${envs[@]}" "$mpirun" "${mpirun_args[@]}" "${mpirun_pass[@]}" "${extra[@]}"
             -np "$np" "$sc_bench" "$@" --csv "$csv" --append)
  say "\$ ${cmd[*]}"
  local rc=0
  "${cmd[@]}" >>"$log" 2>&1 || rc=$?
  if [ $rc -eq 77 ]; then
    say "$(grep '^SKIP' "$log" | tail -n 1 || echo 'SKIP: sc_bench skipped')"
    return 77
  fi
  if [ $rc -ne 0 ]; then
    say "FAIL: sc_bench exited $rc (the end of $log follows)"
    tail -n 20 "$log" >&2
    exit 1
  fi
}

wants_burst() {  # whether collective $1 of shape $2 is measured in bursts too
  [ "$burst" -gt 0 ] && [ "$1" = allreduce ] && [ "${2#*:}" = 0 ]
}
# The burst runs take the single-call options, with their own largest size.
burst_opts=(--burst "$burst")
skip=0
for o in "${bench_opts[@]}"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  [ "$o" = --max-bytes ] && { skip=1; continue; }
  burst_opts+=("$o")
done
burst_opts+=(--max-bytes "$burst_max")
shape_args() {  # sc_bench's options for shape $1 ("MEM:STREAM")
  echo "--mem ${1%:*}$([ "${1#*:}" = 1 ] && echo ' --stream')"
}
rm -f "$out/measured.csv" "$out/verify.csv"
measured=()  # the shapes that were measured (device ones are skipped without a GPU)
for shape in "${shapes[@]}"; do
  skipped=0
  for np in $nps; do
    for c in ${colls//,/ }; do
      route_args=()
      for r in $(routes_for "${shape%:*}" "$c"); do route_args+=(--route "$r"); done
      rc=0
      # shellcheck disable=SC2046  # shape_args is words on purpose
      bench "$np" "$out/measured.csv" -- --coll "$c" $(shape_args "$shape") "${route_args[@]}" \
        "${bench_opts[@]}" --quiet || rc=$?
      [ $rc -eq 77 ] && { skipped=1; break 2; }
      if wants_burst "$c" "$shape"; then
        # Fusion: the same candidates unfused and the MPI's call fused, in bursts. Forced
        # fuse= needs the progress thread to call MPI (a table with fuse= asks for it).
        # On GPU memory with STREAMCOLL_FUSION_NCCL=1, fused messages on NCCL too.
        fused=(--route "pmpi:fuse=$fuse")
        [ "${shape%:*}" = device ] && [ "${STREAMCOLL_FUSION_NCCL:-0}" = 1 ] &&
          fused+=(--route "nccl:fuse=$fuse")
        # shellcheck disable=SC2046
        bench "$np" "$out/measured.csv" STREAMCOLL_THREAD_MULTIPLE=1 -- --coll "$c" \
          $(shape_args "$shape") "${route_args[@]}" "${fused[@]}" \
          "${burst_opts[@]}" --quiet
      fi
    done
  done
  [ $skipped = 0 ] && measured+=("$shape")
done
if [ ${#measured[@]} -eq 0 ]; then
  say "SKIP: nothing measured (device buffers need a GPU)"
  exit 77
fi

say "\$ sc_tune table --tie $tie --out $out/table.txt $out/measured.csv"
"$sc_tune" table --tie "$tie" --out "$out/table.txt" "$out/measured.csv" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { say "FAIL: sc_tune table"; exit 1; }

# A machine profile for the scale model (sc_model predict), fitted to the ht rows of
# allreduce (known host algorithms); informative, so a failure here is only reported.
if [ ! -x "$sc_model" ]; then
  say "note: no profile fitted: sc_model was not built (it needs toml++)"
elif grep -Eq '^allreduce,([^,]*,){7}ht:algo=(rd|rabenseifner|ring),' "$out/measured.csv"; then
  say "\$ sc_model fit --in $out/measured.csv --out $out/profile.toml"
  "$sc_model" fit --in "$out/measured.csv" --out "$out/profile.toml" >>"$log" 2>&1 ||
    say "note: sc_model fit wrote no profile (see $log)"
  grep -E '^level|^copy|^no device' "$log" | tail -n 3 || true
fi

if [ $plot = 1 ]; then
  py=""
  for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
  done
  if [ -n "$py" ]; then
    "$py" "$plot_py" --tie "$tie" --out-dir "$out" --prefix autotune \
      "$out/measured.csv" 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { say "FAIL: plot_routes.py"; exit 1; }
  else
    say "no plots: python3 with matplotlib is not installed (Debian: python3-matplotlib)"
  fi
fi

if [ $verify = 1 ]; then
  for shape in "${measured[@]}"; do
    for np in $nps; do
      for c in ${colls//,/ }; do
        # shellcheck disable=SC2046
        bench "$np" "$out/verify.csv" STREAMCOLL_TUNING_FILE="$out/table.txt" -- --coll "$c" \
          $(shape_args "$shape") --route table --check all "${bench_opts[@]}" --quiet
        if wants_burst "$c" "$shape"; then  # MPI_Iallreduce under the table (fuse= rules)
          # shellcheck disable=SC2046
          bench "$np" "$out/verify.csv" STREAMCOLL_TUNING_FILE="$out/table.txt" -- --coll "$c" \
            $(shape_args "$shape") --route table --check all "${burst_opts[@]}" --quiet
        fi
      done
    done
  done
  say "\$ sc_tune check --table $out/table.txt --measured $out/measured.csv $out/verify.csv"
  "$sc_tune" check --tie "$tie" --table "$out/table.txt" \
    --measured "$out/measured.csv" "$out/verify.csv" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "FAIL: the loaded table does not route as written"; exit 1; }
fi
say "table: $out/table.txt (use it with STREAMCOLL_TUNING_FILE=$out/table.txt)"
