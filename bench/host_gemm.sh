#!/usr/bin/env bash
# oneDNN (amp's host GEMMs) against OpenBLAS on the demo's GEMM shapes, side by
# side in one run; installs libopenblas-openmp-dev for the comparison if missing.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
"$AMP_ROOT/scripts/setup.sh" libopenblas-openmp-dev
dir=$(mktemp -d)
g++ -O2 -std=c++20 -fopenmp -I"$AMP_ROOT/include" -I/usr/include/x86_64-linux-gnu/openblas-openmp \
  "$AMP_ROOT/bench/host_gemm.cpp" -o "$dir/host_gemm" -ldnnl -lopenblas
"$dir/host_gemm"
rm -rf "$dir"
