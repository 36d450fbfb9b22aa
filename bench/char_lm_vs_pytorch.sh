#!/usr/bin/env bash
# char_lm on this CPU, amp against PyTorch eager (Debian's python3-torch,
# installed if missing), side by side in one run: the same model, data order
# and optimiser; training tokens/s, validation loss, the ratios and the
# targets. A benchmark, not a test.
# Usage: bench/char_lm_vs_pytorch.sh [steps per level (200)]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
steps=${1:-200}
data=/usr/share/games/fortunes
"$AMP_ROOT/scripts/setup.sh" python3-torch fortunes
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target char_lm >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "amp (host backend), $steps steps per level ..."
"$AMP_BUILD/examples/char_lm" --device cpu --steps "$steps" --opt-level O0,O1-bf16,O2-bf16 --sample 0 \
  --eval-interval "$steps" --json "$tmp/amp.json" >/dev/null
echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') (CPU, eager), $steps steps per mode ..."
/usr/bin/python3 "$AMP_ROOT/bench/pytorch_char_lm.py" "$data" "$steps" cpu fp32,bf16-autocast > "$tmp/torch.jsonl"
/usr/bin/python3 - "$tmp/amp.json" "$tmp/torch.jsonl" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
amp = {r["opt_level"]: r for r in summary["levels"]}
torch = {r["mode"]: r for r in map(json.loads, open(sys.argv[2]))}
print(f"device: {summary['device']}: {summary['device_details']}")
print(f"{'run':<24}{'tokens/s':>10}{'val loss':>10}{'amp / PyTorch':>15}")
for mode, r in torch.items():
    print(f"{'PyTorch ' + mode:<24}{r['tokens_per_second']:>10.0f}{r['val_loss']:>10.4f}")
for level, r in amp.items():
    ref = torch["fp32" if level == "O0" else "bf16-autocast"]
    print(f"{'amp ' + level:<24}{r['tokens_per_second']:>10.0f}{r['val_loss']:>10.4f}"
          f"{r['tokens_per_second'] / ref['tokens_per_second']:>14.2f}x")
print("(ratio > 1: amp is faster; O0 compares with PyTorch fp32, the bf16 levels with bf16 autocast)")
tps = lambda level: amp[level]["tokens_per_second"]
targets = [("amp O0 >= PyTorch fp32", tps("O0"), torch["fp32"]["tokens_per_second"]),
           ("best amp bf16 level >= PyTorch bf16 autocast", max(tps("O1-bf16"), tps("O2-bf16")),
            torch["bf16-autocast"]["tokens_per_second"])]
print("targets:")
for name, got, limit in targets:
    print(f"  {name:<46} {got:.0f} vs {limit:.0f} tokens/s: {'met' if got >= limit else 'MISSED'}")
PY
