#!/usr/bin/env bash
# Sets up, builds and runs the main job: the Fashion-MNIST MLP at every opt level
# (on the GPU when one is present, else the CPU), writing out/fashion_mnist.json
# and .csv, and drawing them into out/fashion_mnist.png and .svg.
# Arguments go to the program (see --help), e.g. --epochs 1 --train-subset 6000.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$AMP_ROOT/scripts/setup.sh"
# Without a GPU the demo runs on the CPU: a new build folder leaves the GPU half
# out (the tests compile it); one that has it keeps it, so nothing rebuilds.
gpu=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=(-DAMP_EXAMPLES_CUDA=ON)
elif [ ! -f "$AMP_BUILD/CMakeCache.txt" ]; then gpu=(-DAMP_EXAMPLES_CUDA=OFF); fi
start=$(date +%s)
amp_configure "${gpu[@]}"
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target fashion_mnist
echo "demo built in $(( $(date +%s) - start )) s"
mkdir -p "$AMP_ROOT/out"
"$AMP_BUILD/examples/fashion_mnist" --json "$AMP_ROOT/out/fashion_mnist.json" --csv "$AMP_ROOT/out/fashion_mnist.csv" "$@"
# Debian's python3, for which setup.sh installed matplotlib.
/usr/bin/python3 "$AMP_ROOT/scripts/plot.py" "$AMP_ROOT/out/fashion_mnist.json" "$AMP_ROOT/out/fashion_mnist.csv" \
  "$AMP_ROOT/out/fashion_mnist.png"
