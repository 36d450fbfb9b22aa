#!/usr/bin/env bash
# Run by scripts/gpu-check.sh on the GPU machine: PyTorch's AMP (fp32, fp16
# autocast + GradScaler, bf16 autocast) on the recipes and data of
# bench/gpu-programs.sh, as JSON lines into $AMP_WORK for the summary.
# Exit 77 (the check's "refused": a warning, not a failure) where python3 has no
# PyTorch with CUDA: the figures are a comparison, not a check of amp.
set -uo pipefail
: "${AMP_CARRY:?set by scripts/gpu-check.sh}" "${AMP_WORK:?set by scripts/gpu-check.sh}"
here=$(cd "$(dirname "$0")" && pwd)
data=$AMP_CARRY/data
python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null ||
  { echo "refused: python3 has no PyTorch that sees the GPU"; exit 77; }
rc=0
python3 "$here/pytorch_fashion_mnist.py" "$data" 2 cuda mlp >"$AMP_WORK/pytorch_fashion_mnist.jsonl" || rc=1
python3 "$here/pytorch_char_lm.py" "$data/fortunes" 200 cuda fp32,fp16-amp,bf16-autocast \
  >"$AMP_WORK/pytorch_char_lm.jsonl" || rc=1
exit $rc
