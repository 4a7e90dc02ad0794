#!/usr/bin/env bash
# The scale model's route map for GPU counts not measured yet: build/bench/sc_model predict
# on a machine profile (bench/profiles/*.toml, or one fitted by scripts/autotune.sh), the
# tuning table streamcoll loads, the predicted times, and the map as a PNG.
#
#   scripts/predict-routes.sh PROFILE [--out DIR] [sc_model predict options]
#     PROFILE    a machine profile (TOML; config/machine_profile.hpp)
#     --out DIR  where the files go (default predict-NAME, NAME the profile's file name)
#     options    passed to sc_model predict: --gpus 8-4096 (default), --sizes 4:1G,
#                --routes nccl,ht,blueconnect[,nvgroup], --nccl auto|ring|tree, --tie 0.05
# Writes DIR/table.txt (load it with STREAMCOLL_TUNING_FILE), DIR/predicted.csv (sc_bench's
# CSV format, median_us = the model's time), DIR/predict.txt (the map and the times per
# GPU count) and DIR/predict-map-*.png, DIR/predict-latency-*.png (needs
# python3-matplotlib), and checks that the table routes every predicted point to its
# winner (sc_tune check).
# Example: scripts/predict-routes.sh bench/profiles/sierra.toml --gpus 8-4096
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)  # paths given by the caller stay relative to $PWD
[ $# -ge 1 ] && [ -f "$1" ] || {
  echo "usage: scripts/predict-routes.sh PROFILE [--out DIR] [sc_model predict options]" >&2
  exit 2
}
profile=$1
shift
out=predict-$(basename "$profile" .toml)
args=() tie=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift ;;
    --tie) tie=(--tie "$2"); args+=("$1" "$2"); shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
mkdir -p "$out"
"$root/scripts/build.sh" >/dev/null
build=${BUILD_DIR:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
"$build/bench/sc_model" predict --profile "$profile" "${args[@]}" --out "$out/table.txt" \
  --csv "$out/predicted.csv" | tee "$out/predict.txt"
"$build/bench/sc_tune" check "${tie[@]}" --table "$out/table.txt" --measured "$out/predicted.csv"
py=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
done
if [ -n "$py" ]; then
  "$py" "$root/scripts/plot_routes.py" "${tie[@]}" --title "predicted by sc_model, profile $profile" \
    --out-dir "$out" --prefix predict "$out/predicted.csv"
else
  echo "no plots: python3 with matplotlib is not installed (Debian: python3-matplotlib)"
fi
echo "table: $out/table.txt"
