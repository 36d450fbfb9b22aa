#!/usr/bin/env bash
# O2-fp8 against O2-bf16 on char_lm's GPT, interleaved rounds (bf16, fp8,
# bf16, fp8, ...): the median step time and its spread, the validation loss
# and the peak memory by category. Here the FP8 GEMMs are the host's exact
# emulation (codes decoded to fp32, sgemm): what it costs on this CPU. The GPU
# check runs it on the GPU at GPT-2 small's shape (width 768, 12 blocks) on
# cuBLASLt's FP8 kernels. Writes $BENCH_OUT/fp8_gpt.csv (one row per run) and
# .png (when matplotlib is there). A benchmark, not a test.
# Usage: bench/fp8_gpt.sh [rounds (3)] [char_lm flags, e.g. --device cuda --width 768 --layers 12 --heads 12]
#   CHAR_LM: the char_lm binary (default: the build's); AMP_DATA: the fortunes folder.
set -euo pipefail
rounds=${1:-3}
shift || true
source "$(dirname "$0")/char_lm_env.sh"
defaults=(--width 256 --layers 4 --heads 4 --context 128 --batch-size 16 --steps 20 --warmup 5 --eval-interval 20
          --eval-batches 2 --sample 0)
for r in $(seq 1 "$rounds"); do
  for level in O2-bf16 O2-fp8; do
    echo "round $r/$rounds: $level" >&2
    "$CHAR_LM" --data "${AMP_DATA:-/usr/share/games/fortunes}" "${defaults[@]}" "$@" --opt-level "$level" \
      --json "$dir/$level.$r.json" >"$dir/$level.$r.log" 2>&1 || { tail -5 "$dir/$level.$r.log" >&2; exit 1; }
  done
done
"$py" - "$dir" "$out/fp8_gpt" "$rounds" "$*" <<'PY'
import csv, glob, json, os, statistics, sys
work, out, rounds, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = []
for path in sorted(glob.glob(os.path.join(work, "*.json"))):
    j = json.load(open(path))
    lv = j["levels"][0]
    peak = lv["peak_bytes"]
    fp8 = lv.get("fp8") or {}
    rows.append({"level": lv["opt_level"], "round": path.rsplit(".", 2)[-2], "device": j["device"],
                 "step_ms": lv["step_ms"], "tokens_per_second": lv["tokens_per_second"], "val_loss": lv["val_loss"],
                 "fp8_layers": sum(1 for l in fp8.get("layers", []) if l["fp8"]),
                 **{f"peak_{k}": v for k, v in peak.items()}})
with open(out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"char_lm {flags or '(defaults)'} on {rows[0]['device']}, {rounds} interleaved rounds")
print(f"{'level':8} {'fp8 layers':>10} {'ms/step (median, spread)':>25} {'val loss':>9} {'weights MiB':>11} "
      f"{'activ. MiB':>10} {'total MiB':>9}")
med = {}
for level in ("O2-bf16", "O2-fp8"):
    runs = [r for r in rows if r["level"] == level]
    ms = [r["step_ms"] for r in runs]
    med[level] = statistics.median(ms)
    r0 = runs[0]
    print(f"{level:8} {r0['fp8_layers']:10} {med[level]:15.2f} ({max(ms) - min(ms):6.2f}) {r0['val_loss']:9.4f} "
          f"{r0['peak_weights'] / 2**20:11.2f} {r0['peak_activations'] / 2**20:10.2f} {r0['peak_total'] / 2**20:9.2f}")
print(f"O2-fp8 runs at {med['O2-bf16'] / med['O2-fp8']:.2f}x O2-bf16's speed")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print(f"wrote {out}.csv (no matplotlib: no plot)")
    sys.exit(0)
fig, ax = plt.subplots(figsize=(5, 3.5))
for i, level in enumerate(("O2-bf16", "O2-fp8")):
    ms = [r["step_ms"] for r in rows if r["level"] == level]
    ax.bar(i, statistics.median(ms), 0.6, yerr=[[statistics.median(ms) - min(ms)], [max(ms) - statistics.median(ms)]],
           color=("tab:gray", "tab:orange")[i])
ax.set_xticks([0, 1], ["O2-bf16", "O2-fp8"])
ax.set(ylabel="ms per step (median, min-max)", title=f"char_lm GPT on {rows[0]['device']}")
ax.grid(alpha=0.3, axis="y")
fig.tight_layout()
fig.savefig(out + ".png", dpi=120)
print(f"wrote {out}.csv and {out}.png")
PY
