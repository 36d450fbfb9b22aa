#!/usr/bin/env bash
# Sets up, builds and runs the main job: the seed example across all opt levels
# (on the GPU when one is present, else the CPU). Arguments go to the program.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$AMP_ROOT/scripts/setup.sh"
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target seed_linear
"$AMP_BUILD/examples/seed_linear" "$@"
