#!/usr/bin/env bash
# A/B: the same passthrough_latency binary under two libraries, runs interleaved.
set -euo pipefail
runs=$1; old=$2; new=$3; out=$4
export OMPI_MCA_btl_vader_single_copy_mechanism=none
for i in $(seq 1 "$runs"); do
  for v in old new; do
    lib=$old; [ $v = new ] && lib=$new
    echo "## $v run $i ($lib)" >> "$out/$v.txt"
    LD_PRELOAD="$lib" mpirun -np 2 --bind-to core --allow-run-as-root build/bench/passthrough_latency --max 64 --csv "$out/$v-$i.csv" >> "$out/$v.txt"
  done
done
