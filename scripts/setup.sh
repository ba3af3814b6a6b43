#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs, only those missing. Idempotent:
# a second run on a set-up machine installs nothing and takes a second.
set -euo pipefail

packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev libomp-dev make
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libhwy-dev libopenblas-dev
  # the CLI's pictures: Cairo (found through pkg-config) and DejaVu Sans, a TrueType font
  pkgconf libcairo2-dev fonts-dejavu-core
  python3 python3-venv python3-dev
  # ring attention across processes (src/dist/, optional: the build skips it without MPI)
  openmpi-bin libopenmpi-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
