#!/usr/bin/env bash
# The demo's recipe on this CPU, amp against PyTorch (Debian's python3-torch,
# installed if missing), interleaved: each round runs every amp level and every
# PyTorch mode once, one process each, alternating, so a slow spell of this
# shared VM lands on both. Prints each run's median epoch seconds over the
# rounds with the spread (max - min), accuracy, the ratios and the targets, and
# writes out/cpu_vs_pytorch_<model>.csv (one row per run) and .png (medians with
# the spread as error bars). A benchmark, not a test.
# Usage: bench/cpu_vs_pytorch.sh [epochs (1)] [mlp|cnn] [rounds (3)]
# (cnn: O0, O1-bf16 and O2-bf16, the levels its targets name, with the cosine
# schedule in both; an epoch takes ~10-40 s each)
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
epochs=${1:-1}
model=${2:-mlp}
rounds=${3:-3}
levels=O0,O1,O2,O3,O1-bf16,O2-bf16
schedule=constant
[ "$model" = cnn ] && levels=O0,O1-bf16,O2-bf16 && schedule=cosine
data=/usr/share/datasets/fashion-mnist
"$AMP_ROOT/scripts/setup.sh" python3-torch
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target fashion_mnist >/dev/null
mkdir -p "$AMP_ROOT/out"
csv="$AMP_ROOT/out/cpu_vs_pytorch_$model.csv"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') and amp (host backend), $model," \
  "$epochs epoch(s) per run, $rounds interleaved rounds"
for round in $(seq 1 "$rounds"); do
  for level in ${levels//,/ }; do
    echo "  round $round/$rounds: amp $level"
    "$AMP_BUILD/examples/fashion_mnist" --device cpu --model "$model" --epochs "$epochs" --opt-level "$level" \
      --schedule "$schedule" --json "$tmp/amp_${level}_$round.json" >/dev/null
  done
  for mode in fp32 bf16-autocast; do
    echo "  round $round/$rounds: PyTorch $mode"
    /usr/bin/python3 "$AMP_ROOT/bench/pytorch_fashion_mnist.py" "$data" "$epochs" cpu "$model" 1 "$mode" "$schedule" \
      >> "$tmp/torch_$round.jsonl"
  done
done
/usr/bin/python3 - "$tmp" "$model" "$csv" <<'PY'
import glob, json, statistics, sys
tmp, model, csv = sys.argv[1:4]
runs = {}  # name -> [(seconds, accuracy)]
device = ""
for path in sorted(glob.glob(f"{tmp}/amp_*.json")):
    summary = json.load(open(path))
    device = f"{summary['device']}: {summary['device_details']}"
    for r in summary["levels"]:
        runs.setdefault("amp " + r["opt_level"], []).append((r["epoch_seconds"], r["test_accuracy"]))
for path in sorted(glob.glob(f"{tmp}/torch_*.jsonl")):
    for r in map(json.loads, open(path)):
        runs.setdefault("PyTorch " + r["mode"], []).append((r["epoch_seconds"], r["test_accuracy"]))
median = {name: statistics.median(s for s, _ in v) for name, v in runs.items()}
print(f"device: {device}")
print(f"{'run':<22}{'epoch [s] per round':>30}{'median':>9}{'spread':>8}{'test acc':>10}{'PyTorch/amp':>13}")
with open(csv, "w") as f:
    f.write("run,round,epoch_seconds,test_accuracy\n")
    for name in sorted(runs, key=lambda n: (not n.startswith("PyTorch"), n)):
        secs = [s for s, _ in runs[name]]
        for i, (s, a) in enumerate(runs[name]):
            f.write(f"{name},{i + 1},{s:.4f},{a:.4f}\n")
        ratio = ""
        if name.startswith("amp"):
            ref = "PyTorch bf16-autocast" if "bf16" in name else "PyTorch fp32"
            ratio = f"{median[ref] / median[name]:.2f}x"
        print(f"{name:<22}{' / '.join(f'{s:.2f}' for s in secs):>30}{median[name]:>9.2f}{max(secs) - min(secs):>8.2f}"
              f"{statistics.median(a for _, a in runs[name]):>10.4f}{ratio:>13}")
print("(PyTorch/amp > 1: amp is faster; fp16 levels compare with PyTorch fp32, bf16 levels with bf16 autocast)")
t = median
if model == "cnn":  # issue 24's targets
    best = min(t["amp O1-bf16"], t["amp O2-bf16"])
    targets = [("amp O0 <= 0.75 x PyTorch fp32", t["amp O0"], 0.75 * t["PyTorch fp32"]),
               ("best amp bf16 <= 0.75 x PyTorch bf16", best, 0.75 * t["PyTorch bf16-autocast"])]
else:
    targets = [("amp O0 <= PyTorch fp32", t["amp O0"], t["PyTorch fp32"]),
               ("amp O1-bf16 <= PyTorch bf16 autocast", t["amp O1-bf16"], t["PyTorch bf16-autocast"]),
               ("amp O2-bf16 <= PyTorch bf16 autocast", t["amp O2-bf16"], t["PyTorch bf16-autocast"]),
               ("amp O1 <= 1.3 x amp O0", t["amp O1"], 1.3 * t["amp O0"]),
               ("amp O2 <= 1.3 x amp O0", t["amp O2"], 1.3 * t["amp O0"])]
print("targets (medians):")
for name, got, limit in targets:
    print(f"  {name:<40} {got:.3f} s vs {limit:.3f} s: {'met' if got <= limit else 'MISSED'}")
print(f"per-run figures: {csv}")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted(runs, key=lambda n: (not n.startswith("PyTorch"), n))
    lo = [median[n] - min(s for s, _ in runs[n]) for n in names]
    hi = [max(s for s, _ in runs[n]) - median[n] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(names, [median[n] for n in names], xerr=[lo, hi], color=["tab:gray" if n.startswith("PyTorch") else
                                                                     "tab:blue" for n in names])
    ax.set_xlabel("epoch seconds (median, min-max over rounds)")
    ax.set_title(f"{model} on {device.split(':')[0]}: amp vs PyTorch, interleaved")
    fig.tight_layout()
    fig.savefig(csv.replace(".csv", ".png"), dpi=120)
    print(f"plot: {csv.replace('.csv', '.png')}")
except ImportError:
    print("(no plot: python3-matplotlib is not installed)")
PY
