"""Runs the Fashion-MNIST demo on a subset (10000 images, 4 epochs) of the real data at O0 and O2 and checks
that both cross an accuracy bar and that the JSON summary and the CSV are complete; then what the program does
with bad flags, bad output paths, special files and an interrupt."""
import csv
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

binary, data = sys.argv[1], sys.argv[2]
if not os.path.isdir(data):
    print(f"[amp-skip] Fashion-MNIST not found at {data} (apt-get install dataset-fashion-mnist)")
    sys.exit(0)
quick = ["--data", data, "--device", "cpu", "--epochs", "1", "--train-subset", "600", "--opt-level", "O0"]


def run(*args, **kw):
    return subprocess.run([binary, *args], capture_output=True, text=True, **kw)


# Bad input: a clear message naming the flag or the file, exit code 2, before any training.
with tempfile.TemporaryDirectory() as tmp:
    json_path = os.path.join(tmp, "kept.json")
    for args, message in ((["--epochs", "x"], "--epochs must be an integer in [1, 100000], got 'x'"),
                          (["--epochs", "4294967297"], "--epochs must be an integer in [1, 100000], got '4294967297'"),
                          (["--batch-size=0"], "--batch-size must be an integer in [1, 1048576], got '0'"),
                          (["--lr", "0"], "--lr must be a number in (0, 10], got '0'"),
                          (["--train-subset", "-1"], "--train-subset must be an integer in [0, 2147483647], got '-1'"),
                          (["--opt-level", "O9"], "unknown --opt-level 'O9'"),
                          (["--distributed=maybe"], "--distributed must be yes or no, got 'maybe'"),
                          (["--summary", "maybe"], "unexpected argument 'maybe'"),
                          (["--schedule", "linear"], "--schedule must be constant or cosine, got 'linear'"),
                          (["--data", "/nonexistent"], "data set file '/nonexistent/"),
                          (["--frobnicate", "1"], "unknown flag '--frobnicate'"),
                          (["--epochs"], "flag '--epochs' needs a value"),
                          (["--json", os.path.join(tmp, "no-such-folder", "x.json")], "the folder '"),
                          (["--json", tmp], "is a folder, not a file"),
                          (["--json", json_path, "--csv", "/nonexistent-folder/x.csv"], "--csv '/nonexistent-folder/x.csv'")):
        r = run(*args)
        assert r.returncode == 2 and message in r.stderr, (args, r.returncode, r.stderr)
        assert "epoch" not in r.stdout, (args, "trained before refusing")
    assert "--summary [yes|no]" in run("--help").stdout, "switches show their bare form in --help"
    assert not os.path.exists(json_path), "a bad --csv must leave --json unwritten"
    r = run("--help")
    assert r.returncode == 0 and "--epochs N" in r.stdout and "--flag=VALUE" in r.stdout, r.stdout

    # Special files are written in place, never replaced, and their errors reported.
    r = run(*quick, "--json", "/dev/stdout")
    assert r.returncode == 0 and '"program": "fashion_mnist"' in r.stdout, r.stdout[-500:]
    if os.path.exists("/dev/full"):
        r = run(*quick, "--json", "/dev/full")
        assert r.returncode == 2 and "cannot write '/dev/full'" in r.stderr and "wrote /dev/full" not in r.stdout, r
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode), "/dev/full was replaced"

    # O2-fp8's --summary: the MLP's middle Linear in FP8 with its final scales, the first and last kept in bf16.
    r = run(*quick[:-1], "O2-fp8", "--summary", "--json", json_path)
    assert r.returncode == 0, r.stderr
    assert "O2-fp8 FP8 GEMMs (e4m3 forward, e5m2 gradients; delayed scaling, amax history 1024, margin 0)" in r.stdout
    table = r.stdout.split("O2-fp8 FP8 GEMMs")[1].splitlines()[1:4]
    assert [line.split()[:2] for line in table] == [["0", "bf16"], ["2", "fp8"], ["4", "bf16"]], table
    with open(json_path) as f:
        fp8 = json.load(f)["levels"][0]["fp8"]
    assert [l["fp8"] for l in fp8["layers"]] == [False, True, False] and fp8["layers"][1]["scales"]["grad"] > 1, fp8
    os.remove(json_path)

    # --flag=value works like --flag value; the JSON records the settings.
    r = run("--data=" + data, "--device=cpu", "--epochs=1", "--train-subset=600", "--opt-level=O0", "--json=" + json_path)
    assert r.returncode == 0, r.stderr
    with open(json_path) as f:
        summary = json.load(f)
    assert summary["complete"] is True and summary["amp_version"], summary
    assert summary["settings"]["epochs"] == 1 and summary["settings"]["train_subset"] == 600, summary["settings"]
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), "output wider than 80 columns"

    # Checkpoints: 3 epochs straight = 1 epoch, save, resume in a fresh process to 3 (the same results, bit for bit;
    # one thread, as oneDNN's fp32 GEMM sums in another order at another thread count).
    ck = os.path.join(tmp, "run.ckpt")
    runs = {}
    for name, args in (("straight", ["--epochs", "3"]), ("first", ["--epochs", "1", "--save", ck]),
                       ("resumed", ["--epochs", "3", "--resume", ck])):
        paths = [os.path.join(tmp, f"{name}.{ext}") for ext in ("json", "csv", "pred")]
        r = run("--data", data, "--device", "cpu", "--threads", "1", "--train-subset", "2000", "--opt-level", "O2", *args,
                "--json", paths[0], "--csv", paths[1], "--predictions", paths[2])
        assert r.returncode == 0, r.stderr
        with open(paths[0]) as f:
            level = json.load(f)["levels"][0]
        runs[name] = ([{k: e[k] for k in ("epoch", "train_loss", "test_accuracy", "skipped_steps", "loss_scale")}
                       for e in level["epochs"]], level["skipped_steps"], level["final_loss_scale"],
                      *(open(p).read() for p in paths[1:]))
    assert "resumed from" in r.stdout, r.stdout
    assert runs["resumed"] == runs["straight"], (runs["resumed"][:3], runs["straight"][:3])
    for args, message in ((["--opt-level", "all", "--save", ck], "--save needs a single --opt-level, not 'all'"),
                          (["--resume", ck + ".none"], "--resume '" + ck + ".none' cannot be read"),
                          (["--resume", ck, "--epochs", "1"], "has finished 1 epochs already"),
                          (["--resume", ck, "--batch-size", "64"], "was saved with model=mlp optimizer=sgd"),
                          (["--resume", json_path], "is not an amp checkpoint (bad magic number)"),
                          (["--import", ck], "claims a header of")):
        r = run("--data", data, "--device", "cpu", "--train-subset", "2000", "--opt-level", "O2", *args)
        assert r.returncode == 2 and message in r.stderr, (args, r.returncode, r.stderr)

    # A cosine run stopped by SIGINT after an epoch's checkpoint and resumed = the same run straight: the schedule
    # goes on from the saved step. Its length is --epochs, so resuming with other --epochs is refused. One thread
    # in every run: oneDNN's fp32 GEMM sums in another order at another thread count, and the default count (the
    # idle cores) changes with what else runs.
    cosine = ["--data", data, "--device", "cpu", "--threads", "1", "--train-subset", "6000", "--opt-level", "O1",
              "--schedule", "cosine", "--epochs", "3"]
    straight, resumed = os.path.join(tmp, "cos-straight.csv"), os.path.join(tmp, "cos-resumed.csv")
    r = run(*cosine, "--csv", straight, "--json", straight + ".json")
    assert r.returncode == 0, r.stderr
    with open(straight + ".json") as f:
        assert json.load(f)["settings"]["schedule"] == "cosine"
    ck = os.path.join(tmp, "cos.ckpt")
    proc = subprocess.Popen([binary, *cosine, "--save", ck], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not os.path.exists(ck) and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    r = run(*cosine, "--resume", ck, "--csv", resumed)
    if proc.returncode == -signal.SIGINT:  # else all 3 epochs were done before the signal: nothing to resume
        assert r.returncode == 0 and "resumed from" in r.stdout, (r.stdout, r.stderr)
        assert open(resumed).read() == open(straight).read(), "the resumed cosine run differs from the straight one"
    r = run(*cosine[:-1], "4", "--resume", ck)
    assert r.returncode == 2 and "epochs=3" in r.stderr, r.stderr

    # SIGINT during a multi-level run: the finished levels are kept, marked incomplete; exit by the signal.
    os.remove(json_path)
    proc = subprocess.Popen([binary, "--data", data, "--device", "cpu", "--epochs", "2", "--train-subset", "3000",
                             "--opt-level", "all", "--json", json_path, "--csv", json_path + ".csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not os.path.exists(json_path) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    with open(json_path) as f:
        summary = json.load(f)
    assert summary["complete"] is False and len(summary["levels"]) >= 1, summary
    assert "interrupted: kept the" in out, out[-300:]

with tempfile.TemporaryDirectory() as tmp:
    out = {k: os.path.join(tmp, f"run.{k}") for k in ("json", "csv")}
    cmd = [binary, "--data", data, "--device", "cpu", "--opt-level", "O0", "--epochs", "4", "--train-subset", "10000",
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
        assert set(row["peak_bytes"]) == {"weights", "master", "grads", "optimizer", "activations", "workspace", "data",
                                          "total"}
        # The loop after its first step: nothing a CUDA graph could not hold.
        for key in ("host_syncs_in_loop", "allocations_in_loop", "pageable_copies_in_loop"):
            assert row[key] == 0, (key, row[key])
        assert row["launches_per_step"] > 10 and row["graph_nodes"] == 0 and row["step_ms"] > 0, row
        assert [e["epoch"] for e in row["epochs"]] == [1, 2, 3, 4], row["epochs"]
        with open(out["csv"]) as f:
            rows = list(csv.DictReader(f))
        batches = -(-summary["settings"]["train_images"] // 128)
        assert len(rows) == 4 * batches and rows[0].keys() == {"level", "epoch", "step", "loss", "loss_scale", "skipped"}
        assert rows[0]["epoch"] == "1" and rows[-1]["epoch"] == "4", "epochs count from 1, as on the console"
        results.append(row)
    o0, o2 = results
    print(f"O0 accuracy {o0['test_accuracy']:.4f}, O2 accuracy {o2['test_accuracy']:.4f}")
    assert o0["test_accuracy"] >= 0.80 and o2["test_accuracy"] >= 0.80
    assert o0["peak_bytes"]["master"] == 0 and o2["peak_bytes"]["master"] > 0
    ratio = (o2["peak_bytes"]["weights"] + o2["peak_bytes"]["activations"]) / (
        o0["peak_bytes"]["weights"] + o0["peak_bytes"]["activations"])
    assert ratio <= 0.55, ratio

    # --graph: the step captured once and replayed (the partial last batch eagerly) trains bit for bit as the
    # eager run above did, O2's overflow skips and scale included.
    cmd[cmd.index("--opt-level") + 1] = "O2"
    subprocess.run(cmd + ["--graph"], check=True)
    with open(out["json"]) as f:
        graphed = json.load(f)
    (row,) = graphed["levels"]
    assert graphed["settings"]["graph"] is True and row["graph_nodes"] > 10, row["graph_nodes"]
    for key in ("test_accuracy", "skipped_steps", "final_loss_scale"):
        assert row[key] == o2[key], (key, row[key], o2[key])
    assert [e["train_loss"] for e in row["epochs"]] == [e["train_loss"] for e in o2["epochs"]], row["epochs"]
    assert row["host_syncs_in_loop"] == row["allocations_in_loop"] == row["pageable_copies_in_loop"] == 0, row
    print(f"O2 --graph: the same {row['test_accuracy']:.4f}, {row['graph_nodes']} launches recorded per step")
print("demo check passed")
