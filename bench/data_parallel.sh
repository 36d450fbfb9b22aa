#!/usr/bin/env bash
# Data-parallel scaling of the main job, side by side in one run: one process
# against N processes (mpirun, --distributed yes) at the same global batch, so
# every run sees the same samples in the same order. Prints samples/s, the
# speed-up over one process with all the cores, the scaling efficiency (N
# processes over N x one process with one rank's share of the cores), the test
# accuracies and their gap, and writes the rows as CSV. A benchmark, not a test.
# Usage: bench/data_parallel.sh [epochs (2)] [mlp|cnn] [levels (O0,O2-bf16)] [ranks (2)] [device (cpu)]
# On this 2-core machine the N ranks share the cores (one thread each), so the
# figure says what MPI and the smaller per-rank batches cost, not what more
# hardware gives; on a multi-GPU machine run it with device cuda and ranks = GPUs.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
epochs=${1:-2}
model=${2:-mlp}
levels=${3:-O0,O2-bf16}
ranks=${4:-2}
device=${5:-cpu}
global_batch=128
(( global_batch % ranks == 0 )) || { echo "data_parallel: $ranks ranks do not divide the global batch $global_batch" >&2; exit 2; }
"$AMP_ROOT/scripts/setup.sh" libopenmpi-dev openmpi-bin
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target fashion_mnist >/dev/null
out=${AMP_BENCH_OUT:-$AMP_ROOT/out}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # containers forbid the cross-process copy it tries first
cores=$(nproc)
run=("$AMP_BUILD/examples/fashion_mnist" --device "$device" --model "$model" --epochs "$epochs" --opt-level "$levels")
echo "1 process, batch $global_batch, $cores threads ..."
"${run[@]}" --batch-size $global_batch --threads "$cores" --json "$tmp/one.json" >/dev/null
echo "1 process, batch $global_batch, $(( cores / ranks > 0 ? cores / ranks : 1 )) thread(s) (one rank's share) ..."
"${run[@]}" --batch-size $global_batch --threads $(( cores / ranks > 0 ? cores / ranks : 1 )) --json "$tmp/share.json" >/dev/null
echo "$ranks processes, batch $(( global_batch / ranks )) each ..."
mpirun --allow-run-as-root --oversubscribe -np "$ranks" "${run[@]}" --distributed yes \
  --batch-size $(( global_batch / ranks )) --json "$tmp/many.json" >/dev/null
/usr/bin/python3 - "$tmp/one.json" "$tmp/share.json" "$tmp/many.json" "$out/data_parallel.csv" <<'PY'
import csv, json, sys
one, share, many = (json.load(open(p)) for p in sys.argv[1:4])
n = many["world_size"]
print(f"device: {one['device_details']}; {one['settings']['model']}, global batch "
      f"{many['settings']['global_batch_size']}, {one['settings']['epochs']} epochs")
head = f"{'level':<9}{'1 proc/s':>11}{'1 proc, 1 share/s':>19}{f'{n} procs/s':>12}{'speed-up':>10}{'efficiency':>12}" \
       f"{'acc 1 proc':>12}{f'acc {n} procs':>13}{'gap pp':>8}"
print(head)
rows = []
for a, s, m in zip(one["levels"], share["levels"], many["levels"]):
    speedup = m["samples_per_second"] / a["samples_per_second"]
    efficiency = m["samples_per_second"] / (n * s["samples_per_second"])
    gap = 100 * (m["test_accuracy"] - a["test_accuracy"])
    print(f"{a['opt_level']:<9}{a['samples_per_second']:>11.0f}{s['samples_per_second']:>19.0f}"
          f"{m['samples_per_second']:>12.0f}{speedup:>9.2f}x{efficiency:>12.2f}"
          f"{a['test_accuracy']:>12.4f}{m['test_accuracy']:>13.4f}{gap:>+8.2f}")
    rows.append({"level": a["opt_level"], "ranks": n, "samples_per_second_1": a["samples_per_second"],
                 "samples_per_second_1_share": s["samples_per_second"], "samples_per_second_n": m["samples_per_second"],
                 "speedup": speedup, "efficiency": efficiency, "accuracy_1": a["test_accuracy"],
                 "accuracy_n": m["test_accuracy"]})
with open(sys.argv[4], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"(speed-up: {n} processes over 1 process with all the cores; efficiency: {n} processes over {n} x"
      f" '1 share', one process with one rank's share of the cores)\nwrote {sys.argv[4]}")
PY
