#!/usr/bin/env bash
# Checkpoint and safetensors size and time for the demo's CNN (O0, O2, O2-bf16).
# Usage: bench/checkpoint_io.sh [folder to write in (default: the temporary folder)]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
dir=$(mktemp -d)
g++ -O2 -std=c++20 -fopenmp -I"$AMP_ROOT/include" "$AMP_ROOT/bench/checkpoint_io.cpp" -o "$dir/checkpoint_io" -ldnnl -lz
"$dir/checkpoint_io" "${1:-$dir}"
rm -rf "$dir"
