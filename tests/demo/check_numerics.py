"""The numerics report from the examples: fashion_mnist --numerics at every level writes FILE_numerics.csv beside
--csv FILE, with rows for every parameter, gradient, layer output and its gradient (and FP8 operand at O2-fp8) that
agree with the model; scripts/plot.py draws it; a run whose fp16 learning rate overflows names, in its skip log,
the tensor where backward met the inf/NaN first, and the report shows the overflow there; char_lm --numerics
reports too; --numerics without --csv is refused."""
import csv
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

fashion, char_lm, data, fortunes, plot = sys.argv[1:6]
if not os.path.isdir(data):
    print(f"[amp-skip] Fashion-MNIST not found at {data} (apt-get install dataset-fashion-mnist)")
    sys.exit(0)
LEVELS = ["O0", "O1", "O2", "O3", "O1-bf16", "O2-bf16", "O2-fp8"]
# The MLP's Linears, named as torch.nn.Sequential names them (each fused ReLU takes a slot).
MLP = {"0.weight": 784 * 256, "0.bias": 256, "2.weight": 256 * 128, "2.bias": 128, "4.weight": 128 * 10, "4.bias": 10}
KINDS = ("parameter", "gradient", "activation", "activation_grad")


def run(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


with tempfile.TemporaryDirectory() as tmp:
    # --numerics needs --csv: refused before any training.
    r = subprocess.run([fashion, "--data", data, "--numerics", "2"], capture_output=True, text=True)
    assert r.returncode == 2 and "--numerics writes its report beside --csv FILE" in r.stderr, r.stderr

    # Every level, 600 images (5 steps of 128), every 2nd step reported: steps 1, 3 and 5 (counted from 1).
    steps_csv = os.path.join(tmp, "run.csv")
    run(fashion, "--data", data, "--device", "cpu", "--epochs", "1", "--train-subset", "600", "--opt-level", "all",
        "--numerics", "2", "--csv", steps_csv)
    rows = read(os.path.join(tmp, "run_numerics.csv"))
    by_level = defaultdict(list)
    for row in rows:
        by_level[row["level"]].append(row)
    assert sorted(by_level) == sorted(LEVELS), sorted(by_level)
    for level, level_rows in by_level.items():
        assert sorted({int(r["step"]) for r in level_rows}) == [1, 3, 5], (level, {r["step"] for r in level_rows})
        for step in (1, 3, 5):
            at = {(r["tensor"], r["kind"]): r for r in level_rows if int(r["step"]) == step}
            for name, count in MLP.items():
                for kind in ("parameter", "gradient"):
                    row = at.get((name, kind))
                    assert row and int(row["count"]) == count, (level, step, name, kind, row)
                    assert float(row["overflow"]) == 0 and float(row["amax"]) > 0, (level, step, name, kind, row)
            for layer in ("0", "2", "4"):
                for kind in ("activation", "activation_grad"):
                    assert (layer, kind) in at, (level, step, layer, kind)
            fp8 = [r for r in at.values() if r["kind"] == "fp8"]
            assert (len(fp8) == 9) == (level == "O2-fp8"), (level, len(fp8))  # 3 Linears x (input, weight, grad)
            for r in fp8:  # delayed scaling: over 1 when this step's amax outgrew the history's (codes saturated)
                assert float(r["range"]) >= 0 and float(r["scale"]) > 0, r
        grads = [r for r in level_rows if r["kind"] == "gradient"]
        scale = {"O1": 65536.0, "O2": 65536.0, "O3": 1.0}.get(level, 1.0)
        assert all(float(r["scale"]) == scale for r in grads), (level, {r["scale"] for r in grads})
        weights = [r for r in level_rows if r["kind"] == "parameter" and r["tensor"].endswith("weight")]
        assert all(r["dtype"] == {"O0": "fp32", "O1": "fp16", "O2": "fp16", "O3": "fp16", "O1-bf16": "bf16",
                                  "O2-bf16": "bf16", "O2-fp8": "bf16"}[level] for r in weights), level
    png = os.path.join(tmp, "numerics.png")
    p = subprocess.run([plot, os.path.join(os.path.dirname(sys.argv[0]), "..", "..", "scripts", "plot.py"),
                        "--numerics", os.path.join(tmp, "run_numerics.csv"), png], capture_output=True, text=True)
    if "No module named 'matplotlib'" in p.stderr:
        print("(no matplotlib: the plot is not drawn)")
    else:
        assert p.returncode == 0 and os.path.getsize(png) > 10000, p.stderr

    # A learning rate that overflows fp16 at O2: the skipped steps are logged with the tensor where backward met
    # the inf/NaN first, and the report's gradient row of that tensor holds the overflow at that step.
    broken = os.path.join(tmp, "broken.csv")
    out = run(fashion, "--data", data, "--device", "cpu", "--epochs", "1", "--train-subset", "2048", "--opt-level",
              "O2", "--lr", "10", "--momentum", "0.99", "--numerics", "1", "--csv", broken)
    marker = " skipped: backward met an inf/NaN first in the gradient of '"
    skips = [line for line in out.splitlines() if marker in line]
    assert skips, out[-3000:]
    first_skip = skips[0].split()
    step, name = int(first_skip[2]), skips[0].split("'")[1]
    assert name in MLP, name
    logged = {int(s["step"]): s for s in read(broken)}
    assert int(logged[step]["skipped"]) == 1, logged[step]
    at = {r["tensor"]: r for r in read(os.path.join(tmp, "broken_numerics.csv"))
          if int(r["step"]) == step and r["kind"] == "gradient"}
    assert float(at[name]["overflow"]) > 0, (step, name, at[name])
    later = list(MLP)[list(MLP).index(name) + 1:]  # backward reaches them before `name`: finite
    assert all(float(at[n]["overflow"]) == 0 for n in later), (name, {n: at[n]["overflow"] for n in later})

    # char_lm: every layer of a tiny GPT reported.
    if os.path.isdir(fortunes):
        lm_csv = os.path.join(tmp, "lm.csv")
        run(char_lm, "--data", fortunes, "--device", "cpu", "--opt-level", "O2", "--width", "32", "--layers", "1",
            "--heads", "2", "--context", "16", "--batch-size", "4", "--steps", "4", "--eval-interval", "4",
            "--eval-batches", "1", "--warmup", "1", "--sample", "0", "--numerics", "2", "--csv", lm_csv)
        lm = read(os.path.join(tmp, "lm_numerics.csv"))
        assert sorted({int(r["step"]) for r in lm}) == [1, 3], {r["step"] for r in lm}
        kinds = {r["kind"] for r in lm}
        assert set(KINDS) <= kinds, kinds
print("numerics check passed")
