#!/usr/bin/env bash
# The classifier loss at GPT-2's vocabulary: cross_entropy against
# fused_cross_entropy (the gradient written over the logits), AdamW steps on
# embedding -> LayerNorm -> tied projection, at O0 and O2-bf16, interleaved
# rounds. Prints the planned activation memory, the peak of all memory and the
# median step time with its spread per case; writes out/fused_loss.csv (one row
# per run) and .png. A benchmark, not a test.
# Usage: bench/fused_loss.sh [batch (8)] [time (64)] [features (128)] [steps (3)] [rounds (3)]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
"$AMP_ROOT/scripts/setup.sh"
mkdir -p "$AMP_ROOT/out"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
g++ -O2 -std=c++20 -fopenmp -I"$AMP_ROOT/include" "$AMP_ROOT/bench/fused_loss.cpp" -o "$dir/fused_loss" -ldnnl
"$dir/fused_loss" "${1:-8}" "${2:-64}" "${3:-128}" "${4:-3}" "${5:-3}" > "$dir/out.txt"
head -1 "$dir/out.txt"
sed '1,/^csv:$/d' "$dir/out.txt" > "$AMP_ROOT/out/fused_loss.csv"
/usr/bin/python3 - "$AMP_ROOT/out/fused_loss" <<'PY'
import csv, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
rows = list(csv.DictReader(open(out + ".csv")))
levels = sorted({r["level"] for r in rows})
print(f"\n{'level':8} {'loss':6} {'planned MiB':>11} {'peak MiB':>9} {'ms/step (median, spread)':>25} {'loss value':>10}")
stats = {}
for level in levels:
    for kind in ("plain", "fused"):
        runs = [r for r in rows if (r["level"], r["loss"]) == (level, kind)]
        ms = [float(r["step_ms"]) for r in runs]
        stats[level, kind] = (int(runs[0]["planned_bytes"]) / 2**20, int(runs[0]["peak_bytes"]) / 2**20,
                              statistics.median(ms))
        print(f"{level:8} {kind:6} {stats[level, kind][0]:11.1f} {stats[level, kind][1]:9.1f} "
              f"{statistics.median(ms):15.1f} ({max(ms) - min(ms):6.1f}) {float(runs[0]['loss_value']):10.4f}")
    p, f = stats[level, "plain"], stats[level, "fused"]
    print(f"{level:8} fused saves {p[0] - f[0]:.1f} MiB planned ({100 * (1 - f[0] / p[0]):.0f}%), "
          f"{p[1] - f[1]:.1f} MiB peak; step time x{p[2] / f[2]:.2f}")
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
x = range(len(levels))
for i, (kind, color) in enumerate((("plain", "tab:gray"), ("fused", "tab:blue"))):
    axes[0].bar([v + 0.4 * i for v in x], [stats[lv, kind][1] for lv in levels], 0.4, color=color, label=kind)
    axes[1].bar([v + 0.4 * i for v in x], [stats[lv, kind][2] for lv in levels], 0.4, color=color, label=kind)
for a, label in ((axes[0], "peak memory (MiB)"), (axes[1], "ms per step (median)")):
    a.set_xticks([v + 0.2 for v in x], levels)
    a.set(ylabel=label)
    a.legend()
    a.grid(alpha=0.3, axis="y")
axes[0].set_title("cross-entropy at vocab 50257: memory")
axes[1].set_title("step time, this CPU")
fig.tight_layout()
fig.savefig(out + ".png", dpi=120)
print(f"\nwrote {out}.csv and {out}.png")
PY
