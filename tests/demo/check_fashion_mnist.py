"""Runs the Fashion-MNIST demo on a subset (12000 images, 3 epochs) of the real data at O0 and O2 and checks
that both cross an accuracy bar, and that the JSON summary and the CSV are complete."""
import csv
import json
import os
import subprocess
import sys
import tempfile

binary, data = sys.argv[1], sys.argv[2]
if not os.path.isdir(data):
    print(f"[amp-skip] Fashion-MNIST not found at {data} (apt-get install dataset-fashion-mnist)")
    sys.exit(0)
# Bad input: a clear message naming the flag or the file, exit code 2, no output file.
for args, message in ((["--epochs", "x"], "--epochs expects an integer, got 'x'"),
                      (["--opt-level", "O9"], "unknown --opt-level 'O9'"),
                      (["--data", "/nonexistent"], "data set file '/nonexistent/"),
                      (["--frobnicate", "1"], "unknown argument '--frobnicate'")):
    run = subprocess.run([binary, *args], capture_output=True, text=True)
    assert run.returncode == 2 and message in run.stderr, (args, run.returncode, run.stderr)

with tempfile.TemporaryDirectory() as tmp:
    out = {k: os.path.join(tmp, f"run.{k}") for k in ("json", "csv")}
    cmd = [binary, "--data", data, "--device", "cpu", "--opt-level", "O0", "--epochs", "3", "--train-subset", "12000",
           "--json", out["json"], "--csv", out["csv"]]
    results = []
    for level in ("O0", "O2"):
        cmd[cmd.index("--opt-level") + 1] = level
        subprocess.run(cmd, check=True)
        with open(out["json"]) as f:
            summary = json.load(f)
        assert summary["device"].startswith("cpu"), summary["device"]
        (row,) = summary["levels"]
        assert row["opt_level"] == level
        for key in ("test_accuracy", "epoch_seconds", "samples_per_second", "skipped_steps", "final_loss_scale"):
            assert isinstance(row[key], (int, float)), key
        assert set(row["peak_bytes"]) == {"weights", "master", "grads", "optimizer", "activations", "workspace", "total"}
        assert row["allocations_in_loop"] == 0, row
        with open(out["csv"]) as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 3 * 94 and rows[0].keys() == {"level", "epoch", "step", "loss", "loss_scale", "skipped"}
        results.append(row)
    o0, o2 = results
    print(f"O0 accuracy {o0['test_accuracy']:.4f}, O2 accuracy {o2['test_accuracy']:.4f}")
    assert o0["test_accuracy"] >= 0.80 and o2["test_accuracy"] >= 0.80
    assert o0["peak_bytes"]["master"] == 0 and o2["peak_bytes"]["master"] > 0
    ratio = (o2["peak_bytes"]["weights"] + o2["peak_bytes"]["activations"]) / (
        o0["peak_bytes"]["weights"] + o0["peak_bytes"]["activations"])
    assert ratio <= 0.55, ratio
print("demo check passed")
