#!/usr/bin/env bash
# Run by scripts/gpu-check.sh on a GPU machine: the demo on the GPU at every
# level and the seed example, with their tables; JSON into the output folder.
# Usage: bench/gpu-fashion-mnist.sh BUILD_DIR OUT_DIR
set -uo pipefail
build=$1 out=$2
data=${AMP_DATA:-/usr/share/datasets/fashion-mnist}
"$build/examples/seed_linear" --device cuda --json "$out/seed_gpu.json"
if [ -d "$data" ]; then
  "$build/examples/fashion_mnist" --device cuda --data "$data" --epochs 3 --json "$out/fashion_mnist_gpu.json" \
    --plot "$out/fashion_mnist_gpu.svg" | grep -v "epoch"
else
  echo "gpu bench: no Fashion-MNIST at $data (carry it and set AMP_DATA)"
fi
