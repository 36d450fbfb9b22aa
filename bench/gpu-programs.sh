#!/usr/bin/env bash
# Run by scripts/gpu-check.sh on the GPU machine: each carried program on the
# GPU at every level, once eager and once as a captured CUDA graph (--graph),
# as <program>.<eager|graph>.json (and .log) into $AMP_WORK for the summary.
# The recipes are short: a speed and parity check, not the accuracy runs.
# Each program's two runs are side by side, the cheapest program first: a stage
# cut for time still leaves whole eager/graph pairs of the programs that ran.
set -uo pipefail
: "${AMP_CARRY:?set by scripts/gpu-check.sh}" "${AMP_WORK:?set by scripts/gpu-check.sh}"
bin=$AMP_CARRY/bin data=$AMP_CARRY/data
rc=0

# pair PROGRAM ARGS...: eager, then --graph
pair() {
  local name=$1 mode
  shift
  for mode in eager graph; do
    local extra=()
    [ "$mode" = graph ] && extra=(--graph)
    echo "== $name $mode"
    "$bin/$name" --device cuda "$@" "${extra[@]}" --json "$AMP_WORK/$name.$mode.json" >"$AMP_WORK/$name.$mode.log" 2>&1 ||
      { echo "$name $mode: exit $?"; tail -5 "$AMP_WORK/$name.$mode.log"; rc=1; }
  done
}

# bench/gpu-pytorch.sh runs PyTorch on the same recipes: change both together.
pair seed_linear --iterations 500
pair fashion_mnist --data "$data" --epochs 2
pair char_lm --data "$data/fortunes" --steps 200
exit $rc
