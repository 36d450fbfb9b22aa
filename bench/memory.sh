#!/usr/bin/env bash
# Peak memory by category (weights, master, grads, optimizer, activations, workspace) of char_lm at width 256
# with 6 blocks, at O0, O2 and O2-bf16: one process; 2 MPI ranks (data parallel, rank 0's memory; batch 16 per
# rank); 2 ranks with --zero 1 (ZeRO-1: masters and optimizer state sharded); each with and without
# --checkpoint-blocks yes (activation checkpointing). Ratios (x) against the plain run of the level with as many
# processes: what each option costs or saves; time per token counts every rank's tokens. Writes
# $BENCH_OUT/memory.csv and .png (when matplotlib is there). A benchmark, not a test. MPIRUN: the launcher
# (default: mpirun, when there).
# Usage: bench/memory.sh [steps (20)] [char_lm flags, e.g. --device cuda --context 256]
#   CHAR_LM: the char_lm binary (default: the build's); AMP_DATA: the fortunes folder.
set -euo pipefail
steps=${1:-20}
shift $(($# < 1 ? $# : 1))
source "$(dirname "$0")/char_lm_env.sh"
model=(--width 256 --layers 6 --heads 8 --context 128 --batch-size 16 --steps "$steps" --eval-interval "$steps"
       --eval-batches 4 --warmup 2 --sample 0 --dropout 0.1)
mpirun=${MPIRUN:-$(command -v mpirun || true)}
setups="1.0"  # processes.zero
[ -n "$mpirun" ] && setups="1.0 2.0 2.1"
for lv in O0 O2 O2-bf16; do
  for setup in $setups; do
    ranks=${setup%.*} zero=${setup#*.}
    for ck in no yes; do
      echo "$lv, $ranks process(es), --zero $zero, --checkpoint-blocks $ck: $steps steps" >&2
      launch=("$CHAR_LM")
      [ "$ranks" = 1 ] || launch=("$mpirun" --allow-run-as-root --oversubscribe -np "$ranks" "$CHAR_LM" --distributed yes
                                  --zero "$zero")
      name="$lv.$setup.$ck"
      OMP_NUM_THREADS=$((ranks == 1 ? 2 : 1)) "${launch[@]}" "${model[@]}" "$@" --opt-level "$lv" \
        --checkpoint-blocks "$ck" --json "$dir/$name.json" >"$dir/$name.log" 2>&1 ||
        { tail -5 "$dir/$name.log" >&2; exit 1; }
    done
  done
done
"$py" - "$dir" "$out/memory" <<'PY'
import csv, json, os, sys
work, out = sys.argv[1], sys.argv[2]
kinds = ("weights", "master", "grads", "optimizer", "activations", "workspace")
rows = []
for lv in ("O0", "O2", "O2-bf16"):
    plain = {}  # per process count
    for ranks, zero, ck in ((1, 0, "no"), (1, 0, "yes"), (2, 0, "no"), (2, 0, "yes"), (2, 1, "no"), (2, 1, "yes")):
        path = os.path.join(work, f"{lv}.{ranks}.{zero}.{ck}.json")
        if not os.path.exists(path):
            continue
        j = json.load(open(path))
        r = j["levels"][0]
        mib = {k: r["peak_bytes"][k] / 2**20 for k in kinds}
        row = {"level": lv, "setup": ("1 process" if ranks == 1 else f"{ranks} ranks (rank 0)") +
                                     (", ZeRO-1" if zero else "") + (", checkpointed blocks" if ck == "yes" else ""),
               "device": j["device"], **{f"{k}_mib": round(mib[k], 2) for k in kinds},
               "total_mib": round(r["peak_bytes"]["total"] / 2**20, 2),
               "tokens_per_second": round(r["tokens_per_second"], 1), "val_loss": r["val_loss"]}
        base = plain.setdefault(ranks, row)
        row["activations_x"] = round(row["activations_mib"] / base["activations_mib"], 3)
        row["master_optimizer_x"] = round((row["master_mib"] + row["optimizer_mib"]) /
                                          (base["master_mib"] + base["optimizer_mib"]), 3)
        row["step_time_x"] = round(base["tokens_per_second"] / row["tokens_per_second"], 3)
        row["val_loss_rel"] = f"{(row['val_loss'] - base['val_loss']) / base['val_loss']:.2e}"
        rows.append(row)
with open(out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"char_lm width 256, 6 blocks, batch 16 per process, on {rows[0]['device']}: peak MiB by category; "
      "x and rel: against the plain run of the level with as many processes (time x: per token, all ranks counted)")
print(f"{'level':8} {'setup':46} " + " ".join(f"{k[:9]:>9}" for k in kinds) +
      f" {'total':>8} {'act x':>6} {'m+o x':>6} {'time x':>6} {'val loss':>9} {'rel':>9}")
for r in rows:
    print(f"{r['level']:8} {r['setup']:46} " + " ".join(f"{r[k + '_mib']:9.2f}" for k in kinds) +
          f" {r['total_mib']:8.2f} {r['activations_x']:6.3f} {r['master_optimizer_x']:6.3f} {r['step_time_x']:6.3f}"
          f" {r['val_loss']:9.5f} {r['val_loss_rel']:>9}")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("(matplotlib missing: no plot)")
    sys.exit(0)
fig, ax = plt.subplots(figsize=(17, 5))
bottom = [0.0] * len(rows)
labels = [f"{r['level']}\n{r['setup'][0]}{'r' if 'ranks' in r['setup'] else 'p'}{' Z1' if 'ZeRO' in r['setup'] else ''}"
          f" {'ckpt' if 'checkpointed' in r['setup'] else 'plain'}" for r in rows]
for k in kinds:
    vals = [r[k + "_mib"] for r in rows]
    ax.bar(labels, vals, bottom=bottom, label=k)
    bottom = [b + v for b, v in zip(bottom, vals)]
ax.set_ylabel("peak MiB")
ax.set_title("char_lm (width 256, 6 blocks): memory by category")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out + ".png", dpi=120)
print(f"wrote {out}.csv and {out}.png")
PY
