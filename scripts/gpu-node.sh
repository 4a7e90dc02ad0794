#!/usr/bin/env bash
# On the GPU node (../shared/gpu/README.md), from the project's root: runs the gpu test
# suite, or the GPU benchmarks, from a build folder made on a CPU machine.
#   scripts/gpu-node.sh tests|bench|routes|shared|mps OUTDIR [TEST NAME ...]
# The build folder travels as .gpubuild (a copy of build/ without object files) and the
# staged OpenMPI as .gpu/. The build's tests name absolute paths under the checkout they
# were built in ($SC_BUILT_IN, default /work/main); a link there points at this checkout.
# Tests run from build/meson-info/intro-tests.json (scripts/run-tests-json.py): the node's
# meson need not read the build folder. Each log goes to OUTDIR.
set -uo pipefail
cd "$(dirname "$0")/.."
phase=$1 out=$2
mkdir -p "$out"
built_in=${SC_BUILT_IN:-/work/main}
if [ "$(pwd -P)" != "$(cd "$built_in" 2>/dev/null && pwd -P)" ]; then
  mkdir -p "$(dirname "$built_in")" && ln -sfn "$PWD" "$built_in"
fi
if [ -d .gpubuild ]; then rm -rf build && mv .gpubuild build; fi
[ -d /tmp/mpiroot ] || bash .gpu/unpack.sh >/dev/null
source .gpu/env.sh
# run.sh and the benchmarks call mpirun by that name.
mkdir -p /tmp/scbin && ln -sfn /tmp/mpiroot/usr/bin/mpirun.openmpi /tmp/scbin/mpirun
export PATH=/tmp/scbin:$PATH
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || cat .gpucommit 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -5
  mpirun --version 2>&1 | head -1
  ls -l /usr/local/cuda/lib64/libnccl.so* 2>/dev/null; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  nproc
} > "$out/node.txt" 2>&1
lib=$PWD/build/libstreamcoll.so
mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
case $phase in
  tests)
    build/tools/streamcoll-info > "$out/streamcoll_info.txt" 2>&1
    python3 scripts/run-tests-json.py build gpu --timeout-cap "${SC_TEST_CAP:-150}" \
      --log "$out/gpu_tests.log" "${@:3}" | tee "$out/gpu_tests_summary.txt"
    ;;
  bench)
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    run() { local f=$1; shift; echo "# $*" > "$out/$f"; timeout "${SC_BENCH_CAP:-200}" "$@" >> "$out/$f" 2>&1; echo "# rc=$?" >> "$out/$f"; }
    run stream_latency_1rank.txt env LD_PRELOAD=$lib STREAMCOLL_STATS=1 "${mpi[@]}" -np 1 \
      build/bench/stream_latency --max-bytes 16M --iters 300 --warmup 30
    run ht_latency_1rank.txt env LD_PRELOAD=$lib STREAMCOLL_STATS=1 "${mpi[@]}" -np 1 \
      build/bench/ht_latency --iters 100 --warmup 10
    run ht_latency_2ranks.txt env LD_PRELOAD=$lib STREAMCOLL_STATS=1 "${mpi[@]}" -np 2 \
      build/bench/ht_latency --iters 100 --warmup 10
    for np in ${SC_MPS_NP:-2 4}; do
      run sc_bench_allreduce_device_${np}ranks.txt env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 \
        "${mpi[@]}" -np $np build/bench/sc_bench --mem device --stream -b 8 -e 64M -f 4 \
        -n 50 -w 5 --route ht,nvgroup --quiet
    done
    ;;
  routes)
    # Route ht's algorithms on device buffers without a stream (the classic path: the
    # blocking call copies in, runs the host schedule and copies back), stream-ordered,
    # and MPI_Iallreduce fusion on device buffers (bursts of 100, fused by pmpi:fuse=, with
    # and without the batched-copy kernel, and stream-ordered), route ccube at one rank, all in one file
    # (SC_ROUTES_NP: rank counts, default 2 4).
    f=$out/bench_routes.txt
    : > "$f"
    one() { echo "# $*" >> "$f"; timeout "${SC_BENCH_CAP:-60}" "$@" >> "$f" 2>&1; echo "# rc=$?" >> "$f"; }
    for np in ${SC_ROUTES_NP:-2 4}; do
      one env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 "${mpi[@]}" -np $np \
        build/bench/sc_bench --mem device -b 8 -e 16M -f 16 -n 30 -w 3 \
        --route pmpi,ht,ht:algo=ring,ht:algo=ccube --quiet
      one env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 "${mpi[@]}" -np $np \
        build/bench/sc_bench --mem device --burst 100 -b 8 -e 64K -f 8 -n 10 -w 2 \
        --route pmpi,pmpi:fuse=64M,ht --quiet
      # the fused groups' copies one each instead of batched-copy launches
      one env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 STREAMCOLL_STAGING_KERNEL=0 \
        "${mpi[@]}" -np $np build/bench/sc_bench --mem device --burst 100 -b 8 -e 64K -f 8 \
        -n 10 -w 2 --route pmpi:fuse=64M --quiet
      one env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 "${mpi[@]}" -np $np \
        build/bench/sc_bench --mem device --stream -b 8 -e 16M -f 16 -n 30 -w 3 \
        --route ht,ht:algo=ring,ht:algo=ccube --quiet
      # stream-ordered fusion: bursts with a stream attached, fused and not
      one env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 "${mpi[@]}" -np $np \
        build/bench/sc_bench --mem device --stream --burst 100 -b 8 -e 64K -f 8 -n 10 -w 2 \
        --route pmpi,pmpi:fuse=64M,ht,ht:fuse=64M --quiet
      one env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 "${mpi[@]}" -np $np \
        build/bench/sc_bench --mem host --burst 100 -b 8 -e 64K -f 8 -n 10 -w 2 \
        --route pmpi,pmpi:fuse=64M,ht --quiet
    done
    # route ccube (C-Cube's tree on NCCL send/recv) needs a GPU per rank: NCCL refuses
    # ranks sharing one, so on one GPU it runs one rank (each call then a copy)
    one env LD_PRELOAD=$lib "${mpi[@]}" -np 1 build/bench/sc_bench --mem device \
      -b 8 -e 16M -f 16 -n 30 -w 3 --route nccl,ccube,ccube:chunk=64K --quiet
    # fused messages on NCCL (STREAMCOLL_FUSION_NCCL=1; one rank: one GPU) against the
    # host's, bursts of 100 up to sizes where the whole fused buffer's staging counts
    one env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1 STREAMCOLL_FUSION_NCCL=1 \
      "${mpi[@]}" -np 1 build/bench/sc_bench --mem device --burst 100 -b 8 -e 1M -f 16 \
      -n 10 -w 2 --route nccl,pmpi:fuse=64M,nccl:fuse=64M --quiet
    ;;
  shared)
    # Classic calls on device buffers (staged through the host, cuStreamSynchronize per
    # copy) with ranks sharing the GPU: one rank against two, one size alone against the
    # sweep, the progress thread unbound, then the same under the CUDA MPS server.
    f=$out/bench_shared.txt
    : > "$f"
    one() { echo "# $*" >> "$f"; timeout "${SC_BENCH_CAP:-40}" "$@" >> "$f" 2>&1; echo "# rc=$?" >> "$f"; }
    b=(build/bench/sc_bench --mem device -n 30 -w 3 --route pmpi,ht --quiet)
    e=(env LD_PRELOAD=$lib STREAMCOLL_THREAD_MULTIPLE=1)
    one "${e[@]}" "${mpi[@]}" -np 1 "${b[@]}" -b 8 -e 64K -f 8
    one "${e[@]}" "${mpi[@]}" -np 2 "${b[@]}" -b 8 -e 64K -f 8
    one "${e[@]}" "${mpi[@]}" -np 2 "${b[@]}" -b 32K -e 32K
    one "${e[@]}" "${mpi[@]}" -np 2 "${b[@]}" -b 8 -e 8
    one "${e[@]}" STREAMCOLL_PROGRESS_BIND=none "${mpi[@]}" -np 2 "${b[@]}" -b 8 -e 64K -f 8
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d >> "$f" 2>&1 && echo "# MPS server started" >> "$f"
    one "${e[@]}" "${mpi[@]}" -np 2 "${b[@]}" -b 8 -e 64K -f 8
    one "${e[@]}" "${mpi[@]}" -np 4 "${b[@]}" -b 8 -e 64K -f 8
    echo quit | nvidia-cuda-mps-control
    ;;
  mps)
    # The same under the CUDA MPS server: the ranks sharing the GPU then run their kernels
    # side by side instead of in time slices (as ranks on GPUs of their own would).
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d >> "$out/node.txt" 2>&1 && echo "MPS server started" >> "$out/node.txt"
    python3 scripts/run-tests-json.py build gpu --timeout-cap "${SC_TEST_CAP:-150}" \
      --log "$out/gpu_tests_mps.log" "${@:3}" | tee "$out/gpu_tests_mps_summary.txt"
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    # SC_MPS_LIBS: libraries to compare (default: this build's), one after the other.
    for np in ${SC_MPS_NP:-2 4}; do
      : > "$out/sc_bench_mps_${np}ranks.txt"
      for l in ${SC_MPS_LIBS:-$lib}; do
      echo "# MPS, LD_PRELOAD=$l" >> "$out/sc_bench_mps_${np}ranks.txt"
      timeout "${SC_BENCH_CAP:-200}" env LD_PRELOAD=$l STREAMCOLL_THREAD_MULTIPLE=1 \
        "${mpi[@]}" -np $np build/bench/sc_bench --mem device --stream -b 8 -e 64M -f "${SC_MPS_FACTOR:-4}" \
        -n 50 -w 5 --route "${SC_MPS_ROUTES:-ht,nvgroup}" --quiet >> "$out/sc_bench_mps_${np}ranks.txt" 2>&1
      echo "# rc=$?" >> "$out/sc_bench_mps_${np}ranks.txt"
      done
    done
    echo quit | nvidia-cuda-mps-control
    ;;
esac
