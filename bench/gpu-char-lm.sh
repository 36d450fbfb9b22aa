#!/usr/bin/env bash
# Run by scripts/gpu-check.sh on a GPU machine: char_lm on the GPU at every
# level (300 steps: a speed and parity check, not the 650-step accuracy run),
# then PyTorch on the same model, data order and optimizer, as JSON into the
# output folder for the summary.
# Usage: bench/gpu-char-lm.sh BUILD_DIR OUT_DIR DATA_DIR (DATA_DIR/fortunes: the text)
set -uo pipefail
build=$1 out=$2 data=$3/fortunes
here=$(cd "$(dirname "$0")" && pwd)
"$build/examples/char_lm" --device cuda --data "$data" --steps 300 --json "$out/char_lm_gpu.json" \
  --csv "$out/char_lm_gpu.csv"
python3 "$here/pytorch_char_lm.py" "$data" 300 cuda fp32,fp16-amp,bf16-autocast >"$out/pytorch_char_lm_gpu.jsonl"
