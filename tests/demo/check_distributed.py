"""The main job as 2 MPI ranks (mpirun -np 2 fashion_mnist --distributed yes, batch 64 per rank) against one
process with the same global batch of 128, on 10000 images (79 steps) of the real data. Same samples in the same
order: at O0 (fp32 sums, in another order) at most 0.5% of the test predictions may differ, at O2-bf16 the accuracies
agree within 3 pp. With --zero 1 (ZeRO-1 with Adam: each rank keeps the masters and moments of its shard) the
2 ranks give every prediction of the unsharded 2 ranks, in less master + optimizer memory. Also: the JSON's world_size and samples_per_second, only rank 0 writing, and an error ending
the whole job with its message instead of a hang."""
import csv
import json
import os
import subprocess
import sys
import tempfile

mpirun, binary, data = sys.argv[1], sys.argv[2], sys.argv[3]
if not os.path.isdir(data):
    print(f"[amp-skip] Fashion-MNIST not found at {data} (apt-get install dataset-fashion-mnist)")
    sys.exit(0)
env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
common = ["--data", data, "--device", "cpu", "--epochs", "1", "--train-subset", "10000", "--opt-level", "O0,O2-bf16"]
mpi = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def run(args, timeout=600):
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def predictions(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {level: [r[level] for r in rows] for level in ("O0", "O2-bf16")}


with tempfile.TemporaryDirectory() as tmp:
    one_json, two_json = os.path.join(tmp, "one.json"), os.path.join(tmp, "two.json")
    one_pred, two_pred = os.path.join(tmp, "one.csv"), os.path.join(tmp, "two.csv")
    r = run([binary, *common, "--batch-size", "128", "--threads", "1", "--json", one_json, "--predictions", one_pred])
    assert r.returncode == 0, r.stderr
    r = run([*mpi, binary, *common, "--distributed", "--batch-size", "64", "--json", two_json,
             "--predictions", two_pred])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("results on") == 1, "only rank 0 prints the table"
    assert "2 ranks x batch 64 = global batch 128" in r.stdout, r.stdout[:500]
    one, two = json.load(open(one_json)), json.load(open(two_json))
    assert one["world_size"] == 1 and two["world_size"] == 2, (one["world_size"], two["world_size"])
    assert two["settings"]["global_batch_size"] == 128, two["settings"]
    a, b = predictions(one_pred), predictions(two_pred)
    differ = sum(x != y for x, y in zip(a["O0"], b["O0"]))
    assert len(a["O0"]) == 10000 and differ <= 50, f"O0: {differ} of 10000 test predictions differ"
    print(f"O0: {differ} of 10000 test predictions differ between 1 process and 2 ranks")
    for level_one, level_two in zip(one["levels"], two["levels"]):
        # 79 SGD steps at lr 0.05 are chaotic in bf16: gradients that differ only by where bf16 rounds (the ranks'
        # halves summed in bf16, against one fp32-accumulated batch) end up to ~2 pp apart (1.7 pp on an AMX
        # CPU, 2026-12-05; within 1 pp on an AVX512-BF16 one). The exact check is O0's above; tests/parallel
        # checks the 16-bit sums.
        gap = abs(level_one["test_accuracy"] - level_two["test_accuracy"])
        assert gap <= 0.03 and level_two["test_accuracy"] > 0.7, (level_one["opt_level"], level_one["test_accuracy"],
                                                                  level_two["test_accuracy"])
        assert level_two["samples_per_second"] > 0, level_two
        print(f"{level_one['opt_level']}: 1 process {level_one['test_accuracy']:.4f}, 2 ranks "
              f"{level_two['test_accuracy']:.4f}, {level_two['samples_per_second']:.0f} samples/s over both ranks")

    # ZeRO-1 against plain data parallel, Adam (two moments), the CNN (SyncBatchNorm, a norm role) at O2-bf16 and O0.
    cnn = [*mpi, binary, *common[:-4], "--opt-level", "O0,O2-bf16", "--model", "cnn", "--optimizer", "adam",
           "--lr", "0.001", "--train-subset", "2000", "--distributed", "--batch-size", "64"]
    runs = {}
    for zero in ("0", "1"):
        pred, js = os.path.join(tmp, f"zero{zero}.csv"), os.path.join(tmp, f"zero{zero}.json")
        r = run([*cnn, "--zero", zero, "--predictions", pred, "--json", js])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        runs[zero] = (predictions(pred), json.load(open(js)))
    assert runs["1"][0] == runs["0"][0], "--zero 1 changed test predictions"
    assert runs["1"][1]["zero"] == 1
    for plain, zero in zip(runs["0"][1]["levels"], runs["1"][1]["levels"]):
        kept = [l["peak_bytes"]["master"] + l["peak_bytes"]["optimizer"] for l in (plain, zero)]
        assert kept[1] <= 0.55 * kept[0], (plain["opt_level"], kept)
        print(f"{plain['opt_level']}: --zero 1 = 2 ranks plain (10000 predictions); master + optimizer per rank "
              f"{kept[1] / kept[0]:.3f}x")

    # A failing rank (an unreadable --import on one rank is the same as any error): every rank stops, with the
    # reason, well before the timeout.
    bad = os.path.join(tmp, "missing.safetensors")
    r = run([*mpi, binary, *common[:-2], "--opt-level", "O0", "--distributed", "yes", "--import", bad], timeout=120)
    assert r.returncode != 0 and "--import '" + bad + "' cannot be read" in r.stderr, r.stderr[-2000:]
print("distributed check passed")
