#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build amp (apt, as root or via sudo),
# and stops with a clear message when the CUDA toolkit (nvcc) is missing.
set -euo pipefail

need_pkgs=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in cmake g++ make ninja-build doctest-dev libdnnl-dev zlib1g-dev libopenmpi-dev openmpi-bin dataset-fashion-mnist fortunes python3 python3-matplotlib "$@"; do
  have "$pkg" || need_pkgs+=("$pkg")
done
if ((${#need_pkgs[@]})); then
  echo "setup: installing with apt-get: ${need_pkgs[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# cuDNN's C++ frontend (header-only, NVIDIA's; fused attention on the GPU is built on it), from PyPI
# into .deps/. Optional: without it attention on the GPU takes its materialised path.
frontend_version=1.32.0
frontend="$(cd "$(dirname "$0")/.." && pwd)/.deps/cudnn-frontend-$frontend_version"
if [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
  echo "setup: fetching nvidia-cudnn-frontend $frontend_version (headers) from PyPI"
  wheels=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "nvidia-cudnn-frontend==$frontend_version" &&
    python3 -m zipfile -e "$wheels"/nvidia_cudnn_frontend-*.whl "$wheels/unpacked" &&
    mkdir -p "$frontend" && cp -r "$wheels/unpacked/include" "$frontend/" ||
    echo "setup: could not fetch nvidia-cudnn-frontend from PyPI (pip download): building without it" \
         "(attention on the GPU takes its materialised path)" >&2
  rm -rf "$wheels"
fi

if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "setup: nvcc is not on PATH; add it with: export PATH=/usr/local/cuda/bin:\$PATH" >&2
  else
    echo "setup: the CUDA toolkit (nvcc, cuBLAS, CCCL) is missing. Install CUDA Toolkit 12.4+ from NVIDIA" \
         "(package cuda-toolkit) so that /usr/local/cuda/bin/nvcc exists; no GPU is needed to build." >&2
  fi
  exit 1
fi
