#!/usr/bin/env bash
# char_lm's peak memory and speed against its context, with the fused attention
# kernel (O(T) memory per head) and the materialised one (T x T per head), at
# O0 and O2-bf16, a few steps each, interleaved (each round runs every case
# once). Prints per case the peak activation memory, the whole peak and the
# median tokens/s with its spread; writes out/attention_context.csv (one row
# per run) and .png. A benchmark, not a test.
# Usage: bench/attention_context.sh [contexts (256,512,1024)] [steps (3)] [rounds (3)]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
contexts=${1:-256,512,1024}
steps=${2:-3}
rounds=${3:-3}
"$AMP_ROOT/scripts/setup.sh"
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target char_lm >/dev/null
mkdir -p "$AMP_ROOT/out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for round in $(seq 1 "$rounds"); do
  for context in ${contexts//,/ }; do
    for kernel in fused materialized; do
      echo "  round $round/$rounds: context $context, $kernel"
      "$AMP_BUILD/examples/char_lm" --device cpu --opt-level O0,O2-bf16 --context "$context" --attention "$kernel" \
        --steps "$steps" --warmup 0 --eval-interval "$steps" --eval-batches 1 --sample 0 \
        --json "$tmp/${context}_${kernel}_$round.json" >/dev/null
    done
  done
done
/usr/bin/python3 - "$tmp" "$AMP_ROOT/out/attention_context" <<'PY'
import csv, glob, json, os, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
tmp, out = sys.argv[1], sys.argv[2]
rows = []
for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    context, kernel, rnd = os.path.basename(path)[:-5].split("_")
    for lv in json.load(open(path))["levels"]:
        p = lv["peak_bytes"]
        rows.append(dict(context=int(context), kernel=kernel, round=int(rnd), level=lv["opt_level"],
                         activations_mib=p["activations"] / 2**20, workspace_mib=p["workspace"] / 2**20,
                         total_mib=p["total"] / 2**20, tokens_per_second=lv["tokens_per_second"]))
with open(out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
cases = sorted({(r["level"], r["kernel"], r["context"]) for r in rows})
print(f"\n{'level':8} {'kernel':13} {'context':>7} {'activations MiB':>15} {'workspace MiB':>13} {'peak MiB':>9} "
      f"{'tokens/s (median, spread)':>26}")
for level, kernel, context in cases:
    runs = [r for r in rows if (r["level"], r["kernel"], r["context"]) == (level, kernel, context)]
    tps = [r["tokens_per_second"] for r in runs]
    print(f"{level:8} {kernel:13} {context:7d} {runs[0]['activations_mib']:15.1f} {runs[0]['workspace_mib']:13.1f} "
          f"{runs[0]['total_mib']:9.1f} {statistics.median(tps):16.0f} ({max(tps) - min(tps):6.0f})")
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for level in sorted({c[0] for c in cases}):
    for kernel, style in (("fused", "-"), ("materialized", "--")):
        pts = sorted({(c[2], next(r["activations_mib"] for r in rows if (r["level"], r["kernel"], r["context"]) == c))
                      for c in cases if c[0] == level and c[1] == kernel})
        tps = [statistics.median(r["tokens_per_second"] for r in rows
                                 if (r["level"], r["kernel"], r["context"]) == (level, kernel, x)) for x, _ in pts]
        axes[0].plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", label=f"{level} {kernel}")
        axes[1].plot([x for x, _ in pts], tps, style, marker="o", label=f"{level} {kernel}")
axes[0].set(xlabel="context (tokens)", ylabel="peak activations (MiB)", title="char_lm activation memory")
axes[1].set(xlabel="context (tokens)", ylabel="tokens/s (median)", title="char_lm training speed, this CPU")
for a in axes:
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(out + ".png", dpi=120)
print(f"\nwrote {out}.csv and {out}.png")
PY
