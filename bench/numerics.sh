#!/usr/bin/env bash
# What the numerics report costs a training step: char_lm at O2 and O2-fp8 with --numerics 0 (off), 10 and 1
# (every step reported), interleaved (off, 10, 1, off, 10, 1, ...) over 3 rounds; the median time per step and
# the spread (max - min) over the rounds, and each setting's ratio to off. Off runs nothing of the report; on,
# every step adds the search for the first non-finite gradient (behind the check's verdict: it reads no gradient
# unless the step overflowed), and a reported step the statistics of every parameter, gradient, layer output and
# its gradient (one read of each). Writes $BENCH_OUT/numerics.csv and .png. A benchmark, not a test.
# Usage: bench/numerics.sh [steps (40)] [char_lm flags, e.g. --device cuda]
#   CHAR_LM: the char_lm binary (default: the build's); AMP_DATA: the fortunes folder.
set -euo pipefail
steps=${1:-40}
shift $(($# < 1 ? $# : 1))
source "$(dirname "$0")/char_lm_env.sh"
model=(--width 128 --layers 2 --heads 4 --context 64 --batch-size 16 --steps "$steps" --eval-interval "$steps"
       --eval-batches 2 --warmup 2 --sample 0)
for round in 1 2 3; do
  for lv in O2 O2-fp8; do
    for every in 0 10 1; do
      echo "round $round: $lv --numerics $every, $steps steps" >&2
      name="$lv.$every.$round"
      "$CHAR_LM" "${model[@]}" "$@" --opt-level "$lv" --numerics "$every" --csv "$dir/$name.csv" \
        --json "$dir/$name.json" >"$dir/$name.log" 2>&1 || { tail -5 "$dir/$name.log" >&2; exit 1; }
    done
  done
done
"$py" - "$dir" "$out/numerics" <<'PY'
import csv, json, os, statistics, sys
work, out = sys.argv[1], sys.argv[2]
rows = []
for lv in ("O2", "O2-fp8"):
    base = None
    for every in (0, 10, 1):
        ms = [json.load(open(os.path.join(work, f"{lv}.{every}.{r}.json")))["levels"][0]["step_ms"] for r in (1, 2, 3)]
        device = json.load(open(os.path.join(work, f"{lv}.{every}.1.json")))["device"]
        med = statistics.median(ms)
        base = base or med
        rows.append({"level": lv, "numerics_every": every or "off", "device": device, "step_ms_median": round(med, 3),
                     "step_ms_spread": round(max(ms) - min(ms), 3), "vs_off": round(med / base, 3)})
with open(out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"{'level':8} {'numerics':>9} {'step ms (median)':>17} {'spread':>8} {'vs off':>7}")
for r in rows:
    print(f"{r['level']:8} {str(r['numerics_every']):>9} {r['step_ms_median']:17.3f} {r['step_ms_spread']:8.3f} "
          f"{r['vs_off']:7.3f}")
print(f"device: {rows[0]['device']}; wrote {out}.csv")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(7, 4))
labels = [f"{r['level']}\n{r['numerics_every']}" for r in rows]
ax.bar(labels, [r["step_ms_median"] for r in rows], yerr=[r["step_ms_spread"] / 2 for r in rows], capsize=4)
ax.set_ylabel("ms per step (median of 3, bar: spread)")
ax.set_title(f"char_lm step time with the numerics report ({rows[0]['device']})")
fig.tight_layout()
fig.savefig(out + ".png", dpi=110)
print(f"wrote {out}.png")
PY
