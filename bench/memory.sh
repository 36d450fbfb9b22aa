#!/usr/bin/env bash
# Peak memory by category (weights, master, grads, optimizer, activations, workspace) of char_lm at width 256
# with 6 blocks, at O0, O2 and O2-bf16: one process and 2 MPI ranks (data parallel, rank 0's memory; batch 16
# per rank), each with and without --checkpoint-blocks yes (activation checkpointing); the step time and the
# validation loss of each against the one-process plain run of its level. Writes $BENCH_OUT/memory.csv and .png
# (when matplotlib is there). A benchmark, not a test. MPIRUN: the launcher (default: mpirun, when there).
# Usage: bench/memory.sh [steps (20)] [char_lm flags, e.g. --device cuda --context 256]
#   CHAR_LM: the char_lm binary (default: the build's); AMP_DATA: the fortunes folder.
set -euo pipefail
steps=${1:-20}
shift $(($# < 1 ? $# : 1))
source "$(dirname "$0")/char_lm_env.sh"
model=(--width 256 --layers 6 --heads 8 --context 128 --batch-size 16 --steps "$steps" --eval-interval "$steps"
       --eval-batches 4 --warmup 2 --sample 0 --dropout 0.1)
mpirun=${MPIRUN:-$(command -v mpirun || true)}
setups="1"
[ -n "$mpirun" ] && setups="1 2"
for lv in O0 O2 O2-bf16; do
  for ranks in $setups; do
    for ck in no yes; do
      echo "$lv, $ranks process(es), --checkpoint-blocks $ck: $steps steps" >&2
      launch=("$CHAR_LM")
      [ "$ranks" = 1 ] || launch=("$mpirun" --allow-run-as-root --oversubscribe -np "$ranks" "$CHAR_LM" --distributed yes)
      OMP_NUM_THREADS=$((ranks == 1 ? 2 : 1)) "${launch[@]}" "${model[@]}" "$@" --opt-level "$lv" \
        --checkpoint-blocks "$ck" --json "$dir/$lv.$ranks.$ck.json" >"$dir/$lv.$ranks.$ck.log" 2>&1 ||
        { tail -5 "$dir/$lv.$ranks.$ck.log" >&2; exit 1; }
    done
  done
done
"$py" - "$dir" "$out/memory" <<'PY'
import csv, json, os, sys
work, out = sys.argv[1], sys.argv[2]
kinds = ("weights", "master", "grads", "optimizer", "activations", "workspace")
rows = []
for lv in ("O0", "O2", "O2-bf16"):
    plain = None
    for ranks, ck in ((1, "no"), (1, "yes"), (2, "no"), (2, "yes")):
        path = os.path.join(work, f"{lv}.{ranks}.{ck}.json")
        if not os.path.exists(path):
            continue
        j = json.load(open(path))
        r = j["levels"][0]
        mib = {k: r["peak_bytes"][k] / 2**20 for k in kinds}
        row = {"level": lv, "setup": ("1 process" if ranks == 1 else f"{ranks} ranks (rank 0)") +
                                     (", checkpointed blocks" if ck == "yes" else ""),
               "device": j["device"], **{f"{k}_mib": round(mib[k], 2) for k in kinds},
               "total_mib": round(r["peak_bytes"]["total"] / 2**20, 2),
               "tokens_per_second": round(r["tokens_per_second"], 1), "val_loss": r["val_loss"]}
        if plain is None:
            plain = row
        row["activations_x"] = round(row["activations_mib"] / plain["activations_mib"], 3)
        row["master_optimizer_x"] = round((row["master_mib"] + row["optimizer_mib"]) /
                                          (plain["master_mib"] + plain["optimizer_mib"]), 3)
        row["step_time_x"] = round(plain["tokens_per_second"] / row["tokens_per_second"], 3)
        row["val_loss_rel"] = f"{(row['val_loss'] - plain['val_loss']) / plain['val_loss']:.2e}"
        rows.append(row)
with open(out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"char_lm width 256, 6 blocks, batch 16 per process, on {rows[0]['device']}: peak MiB by category; "
      "x: against the one-process plain run of the level (time x: per token, all ranks counted)")
print(f"{'level':8} {'setup':38} " + " ".join(f"{k[:9]:>9}" for k in kinds) +
      f" {'total':>8} {'act x':>6} {'m+o x':>6} {'time x':>6} {'val loss':>9} {'rel':>9}")
for r in rows:
    print(f"{r['level']:8} {r['setup']:38} " + " ".join(f"{r[k + '_mib']:9.2f}" for k in kinds) +
          f" {r['total_mib']:8.2f} {r['activations_x']:6.3f} {r['master_optimizer_x']:6.3f} {r['step_time_x']:6.3f}"
          f" {r['val_loss']:9.5f} {r['val_loss_rel']:>9}")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("(matplotlib missing: no plot)")
    sys.exit(0)
fig, ax = plt.subplots(figsize=(12, 4.5))
bottom = [0.0] * len(rows)
labels = [f"{r['level']}\n{r['setup'][0]}{'r' if 'ranks' in r['setup'] else 'p'} {'ckpt' if 'checkpointed' in r['setup'] else 'plain'}"
          for r in rows]
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
