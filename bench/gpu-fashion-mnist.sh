#!/usr/bin/env bash
# Run by scripts/gpu-check.sh on a GPU machine: the seed example and the demo on
# the GPU at every level, then PyTorch's AMP on the same recipe and data, all
# as JSON into the output folder for the summary.
# Usage: bench/gpu-fashion-mnist.sh BUILD_DIR OUT_DIR DATA_DIR
set -uo pipefail
build=$1 out=$2 data=$3
here=$(cd "$(dirname "$0")" && pwd)
"$build/examples/seed_linear" --device cuda --json "$out/seed_linear_gpu.json"
"$build/examples/fashion_mnist" --device cuda --data "$data" --epochs 3 --json "$out/fashion_mnist_gpu.json" \
  --csv "$out/fashion_mnist_gpu.csv"
python3 "$here/pytorch_fashion_mnist.py" "$data" 3 cuda >"$out/pytorch_fashion_mnist_gpu.jsonl"
