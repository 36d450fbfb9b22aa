#!/usr/bin/env bash
# Run by scripts/gpu-check.sh on the GPU machine: each carried program on the
# GPU at every level, once eager and once as a captured CUDA graph (--graph),
# as <program>.<eager|graph>.json (and .log) into $AMP_WORK for the summary.
# The recipes are short: a speed and parity check, not the accuracy runs.
set -uo pipefail
: "${AMP_CARRY:?set by scripts/gpu-check.sh}" "${AMP_WORK:?set by scripts/gpu-check.sh}"
bin=$AMP_CARRY/bin data=$AMP_CARRY/data
rc=0

# run MODE PROGRAM ARGS...
run() {
  local mode=$1 name=$2
  shift 2
  [ "$mode" = graph ] && set -- "$@" --graph
  echo "== $name $mode"
  "$bin/$name" --device cuda "$@" --json "$AMP_WORK/$name.$mode.json" >"$AMP_WORK/$name.$mode.log" 2>&1 ||
    { echo "$name $mode: exit $?"; tail -5 "$AMP_WORK/$name.$mode.log"; rc=1; }
}

for mode in eager graph; do
  run $mode seed_linear --iterations 500
  run $mode fashion_mnist --data "$data" --epochs 3
  run $mode char_lm --data "$data/fortunes" --steps 300
done
exit $rc
