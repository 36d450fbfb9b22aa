#!/usr/bin/env bash
# OpenBLAS against BLIS on the demo's GEMM shapes, side by side in one run.
set -euo pipefail
dir=$(mktemp -d)
src="$(dirname "$0")/host_sgemm.cpp"
inc=/usr/include/x86_64-linux-gnu
g++ -O2 -I"$inc" "$src" -o "$dir/openblas" -lopenblas
g++ -O2 -I"$inc" "$src" -o "$dir/blis" -L/usr/lib/x86_64-linux-gnu/blis-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/blis-openmp -lblis
echo "OpenBLAS ($(nproc) threads):"; "$dir/openblas"
echo "BLIS ($(nproc) threads):"; BLIS_NUM_THREADS=$(nproc) "$dir/blis"
rm -rf "$dir"
