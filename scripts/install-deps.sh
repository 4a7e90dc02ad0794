#!/usr/bin/env bash
# Installs the Debian 12 packages streamcoll needs to build and test (as root, or with
# sudo). The CUDA toolkit is optional: the build uses /usr/local/cuda when it is there.
set -euo pipefail
pkgs=(build-essential pkg-config meson ninja-build openmpi-bin libopenmpi-dev libhwloc-dev
      doctest-dev gfortran libtomlplusplus-dev python3-matplotlib lmod mpich libmpich-dev
      iproute2 pmccabe)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
