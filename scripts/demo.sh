#!/usr/bin/env bash
# Sets up, builds and runs the main job: the Fashion-MNIST MLP at every opt level
# (on the GPU when one is present, else the CPU), writing out/fashion_mnist.json
# and .csv, and drawing them into out/fashion_mnist.png and .svg.
# Arguments go to the program (see --help).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$AMP_ROOT/scripts/setup.sh"
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target fashion_mnist
mkdir -p "$AMP_ROOT/out"
"$AMP_BUILD/examples/fashion_mnist" --json "$AMP_ROOT/out/fashion_mnist.json" --csv "$AMP_ROOT/out/fashion_mnist.csv" "$@"
/usr/bin/python3 "$AMP_ROOT/scripts/plot.py" "$AMP_ROOT/out/fashion_mnist.json" "$AMP_ROOT/out/fashion_mnist.csv" \
  "$AMP_ROOT/out/fashion_mnist.png"
