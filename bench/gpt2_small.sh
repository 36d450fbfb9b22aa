#!/usr/bin/env bash
# GPT-2 small (124M: 12 blocks, width 768, 12 heads, vocabulary 50257, context 1024) through char_lm on llm.c
# token files (the fortunes as bytes, scripts/make_token_files.py; the vocabulary is GPT-2's, so the embedding and the
# head have their full size). First it builds and trains one step at every level (context 128), then it trains
# a few steps at one level at full context: tokens/s, model TFLOP/s (6 N + 12 L C T per token, as nanoGPT counts)
# and, given the card's peak (--peak TFLOPS), MFU against llm.c's published ~463K tokens/s per H100; the peak
# memory by category. Writes $BENCH_OUT/gpt2_small.csv and .png (when matplotlib is there). A benchmark, not a test.
# Usage: bench/gpt2_small.sh [steps (4)] [level (O2-bf16)] [batch (1)] [--peak TFLOPS] [char_lm flags, e.g. --device cuda]
#   CHAR_LM: the char_lm binary (default: the build's); AMP_DATA: the fortunes folder;
#   GPT2_BUILD_LEVELS: the levels of the one-step builds (default: all seven; "" for none).
set -euo pipefail
steps=${1:-4} level=${2:-O2-bf16} batch=${3:-1}
shift $(($# < 3 ? $# : 3))
peak=0
if [ "${1:-}" = "--peak" ]; then peak=$2; shift 2; fi
source "$(dirname "$0")/char_lm_env.sh"
"$py" "$root/scripts/make_token_files.py" "$dir/fortunes" "${AMP_DATA:-/usr/share/games/fortunes}" >/dev/null
gpt2=(--train-tokens "$dir/fortunes_train.bin" --val-tokens "$dir/fortunes_val.bin" --vocab-size 50257 --layers 12
      --width 768 --heads 12 --warmup 1 --eval-batches 1 --sample 0)
for lv in ${GPT2_BUILD_LEVELS-O0 O1 O2 O3 O1-bf16 O2-bf16 O2-fp8}; do
  echo "builds and trains one step at $lv (context 128)" >&2
  "$CHAR_LM" "${gpt2[@]}" "$@" --context 128 --batch-size 1 --steps 1 --opt-level "$lv" --json "$dir/build.$lv.json" \
    >"$dir/build.$lv.log" 2>&1 || { tail -5 "$dir/build.$lv.log" >&2; exit 1; }
done
echo "$steps steps at $level, context 1024, batch $batch" >&2
"$CHAR_LM" "${gpt2[@]}" "$@" --context 1024 --batch-size "$batch" --steps "$steps" --eval-interval "$steps" \
  --opt-level "$level" --json "$dir/run.json" | tee "$dir/run.log" | grep -E "step|val loss" >&2 || true
[ -f "$dir/run.json" ] || { tail -5 "$dir/run.log" >&2; exit 1; }
"$py" - "$dir" "$out/gpt2_small" "$peak" <<'PY'
import csv, glob, json, os, sys
work, out, peak = sys.argv[1], sys.argv[2], float(sys.argv[3])
V, T, L, C = 50257, 1024, 12, 768
N = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # 124,439,808: transformers' count, the head tied
flops_per_token = 6 * N + 12 * L * C * T
kinds = ("weights", "master", "grads", "optimizer", "activations", "workspace", "data")
rows = []
for path in sorted(glob.glob(os.path.join(work, "build.*.json"))) + [os.path.join(work, "run.json")]:
    j = json.load(open(path))
    lv, s = j["levels"][0], j["settings"]
    tflops = lv["tokens_per_second"] * flops_per_token / 1e12
    rows.append({"level": lv["opt_level"], "device": j["device"], "context": s["context"], "batch": s["batch_size"],
                 "steps": s["steps"], "tokens_per_second": round(lv["tokens_per_second"], 1),
                 "model_tflops": round(tflops, 3), "mfu": round(tflops / peak, 4) if peak else "",
                 "val_loss": round(lv["val_loss"], 4), "skipped": lv["skipped_steps"],
                 **{f"{k}_mib": round(lv["peak_bytes"][k] / 2**20, 1) for k in kinds},
                 "total_mib": round(lv["peak_bytes"]["total"] / 2**20, 1)})
with open(out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"GPT-2 small ({N:,} parameters, {flops_per_token / 1e9:.2f} GFLOP per token at context 1024) on {rows[0]['device']}")
print(f"{'level':8} {'ctx':>5} {'batch':>5} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} " +
      " ".join(f"{k[:9]:>9}" for k in kinds) + f" {'total MiB':>9}")
for r in rows:
    mfu = f"{100 * r['mfu']:5.1f}%" if peak else "     -"
    print(f"{r['level']:8} {r['context']:5} {r['batch']:5} {r['tokens_per_second']:10.0f} {r['model_tflops']:8.3f} "
          f"{mfu} " + " ".join(f"{r[k + '_mib']:9.1f}" for k in kinds) + f" {r['total_mib']:9.1f}")
last = rows[-1]
print(f"llm.c's published figure: ~463,000 tokens/s per H100 at bf16; this run {last['tokens_per_second']:.0f} "
      f"({last['tokens_per_second'] / 463000:.4f}x)")
print(f"wrote {out}.csv")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(8, 4))
bottom = [0.0] * len(rows)
labels = [f"{r['level']}\nctx {r['context']}" for r in rows]
for k in kinds:
    vals = [r[k + "_mib"] for r in rows]
    ax.bar(labels, vals, bottom=bottom, label=k)
    bottom = [b + v for b, v in zip(bottom, vals)]
ax.set_ylabel("peak MiB")
ax.set_title(f"GPT-2 small on {rows[0]['device']}: peak memory by category")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(out + ".png", dpi=120)
print(f"wrote {out}.png")
PY
