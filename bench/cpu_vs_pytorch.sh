#!/usr/bin/env bash
# The demo's recipe on this CPU, amp against PyTorch (Debian's python3-torch,
# installed if missing), side by side in one run: median epoch seconds, test
# accuracy, the ratios and the targets. A benchmark, not a test.
# Usage: bench/cpu_vs_pytorch.sh [epochs (3)] [mlp|cnn]
# (cnn: O0, O1-bf16 and O2-bf16, the levels its targets name, with the cosine
# schedule in both; an epoch takes ~12-45 s each)
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
epochs=${1:-3}
model=${2:-mlp}
levels=all
schedule=constant
[ "$model" = cnn ] && levels=O0,O1-bf16,O2-bf16 && schedule=cosine
data=/usr/share/datasets/fashion-mnist
"$AMP_ROOT/scripts/setup.sh" python3-torch
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target fashion_mnist >/dev/null
tmp=$(mktemp -d)
echo "amp (host backend), $model, $epochs epochs per level ..."
"$AMP_BUILD/examples/fashion_mnist" --device cpu --model "$model" --epochs "$epochs" --opt-level "$levels" \
  --schedule "$schedule" --json "$tmp/amp.json" >/dev/null
echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') (CPU), $epochs epochs per mode ..."
/usr/bin/python3 "$AMP_ROOT/bench/pytorch_fashion_mnist.py" "$data" "$epochs" cpu "$model" 1 all "$schedule" \
  > "$tmp/torch.jsonl"
/usr/bin/python3 - "$tmp/amp.json" "$tmp/torch.jsonl" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
amp = {r["opt_level"]: r for r in summary["levels"]}
torch = {r["mode"]: r for r in map(json.loads, open(sys.argv[2]))}
print(f"device: {summary['device']}: {summary['device_details']}")
print(f"{'run':<22}{'epoch [s]':>10}{'test acc':>10}{'PyTorch / amp':>15}")
for mode, r in torch.items():
    print(f"{'PyTorch ' + mode:<22}{r['epoch_seconds']:>10.3f}{r['test_accuracy']:>10.4f}{'':>15}")
for level, r in amp.items():
    ref = torch["fp32" if level in ("O0", "O1", "O2", "O3") else "bf16-autocast"]
    print(f"{'amp ' + level:<22}{r['epoch_seconds']:>10.3f}{r['test_accuracy']:>10.4f}"
          f"{ref['epoch_seconds'] / r['epoch_seconds']:>14.2f}x")
print("(ratio > 1: amp is faster; fp16 levels compare with PyTorch fp32, bf16 levels with bf16 autocast)")
t = lambda level: amp[level]["epoch_seconds"]
best_bf16 = min(t("O1-bf16"), t("O2-bf16"))
targets = [("amp O0 <= PyTorch fp32", t("O0"), torch["fp32"]["epoch_seconds"]),
           ("best amp bf16 level <= PyTorch bf16", best_bf16, torch["bf16-autocast"]["epoch_seconds"])]
if summary["settings"]["model"] == "mlp":
    targets = [("amp O0 <= PyTorch fp32", t("O0"), torch["fp32"]["epoch_seconds"]),
           ("amp O1-bf16 <= PyTorch bf16 autocast", t("O1-bf16"), torch["bf16-autocast"]["epoch_seconds"]),
           ("amp O2-bf16 <= PyTorch bf16 autocast", t("O2-bf16"), torch["bf16-autocast"]["epoch_seconds"]),
           ("amp O1 <= 1.3 x amp O0", t("O1"), 1.3 * t("O0")),
           ("amp O2 <= 1.3 x amp O0", t("O2"), 1.3 * t("O0"))]
print("targets:")
for name, got, limit in targets:
    print(f"  {name:<38} {got:.3f} s vs {limit:.3f} s: {'met' if got <= limit else 'MISSED'}")
PY
rm -rf "$tmp"
