#!/usr/bin/env bash
# The scale model's table loads and routes as predicted: sc_model predict writes a table
# and the predicted times (sc_bench CSV) for a shipped profile; sc_tune check loads the
# table with the library's parser and verifies that every predicted point is routed to
# its predicted winner (8 to 4096 GPUs, 4 B to 1 GiB, both shipped profiles).
#   predict_table.sh BUILD_DIR SOURCE_DIR OUT_DIR
set -euo pipefail
build=$1 src=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
for profile in sierra minsky192; do
  "$build/bench/sc_model" predict --profile "$src/bench/profiles/$profile.toml" --gpus 8-4096 \
    --routes nccl,ht,blueconnect --out "$out/$profile-table.txt" --csv "$out/$profile.csv" \
    >"$out/$profile-predict.txt"
  "$build/bench/sc_tune" check --table "$out/$profile-table.txt" --measured "$out/$profile.csv"
done
echo "PASS: predicted tables route every predicted point to its winner"
