"""Runs char_lm briefly (40 steps) on the fortunes files at O0, O2, O1-bf16 and O2-fp8 and checks that every level
learns (the validation loss falls far below the uniform guess, ln vocab), that the mixed levels track O0, and
that the JSON summary, the CSV and the sample are complete; that --graph and the fused loss train bit for bit
as the eager step and the plain loss, and --checkpoint-blocks in less memory; that a run resumed from its checkpoint
continues bit for bit (the level and shape taken from it when not given; a shape given otherwise refused), that
generation from a checkpoint gives the same text with and without the key/value cache and from the exported
weights; that llm.c token files written by scripts/make_token_files.py train end to end; then what the program does with
bad input."""
import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile

binary, data = sys.argv[1], sys.argv[2]
if not os.path.isdir(data):
    print(f"[amp-skip] the fortunes files are not at {data} (apt-get install fortunes)")
    sys.exit(0)


# Runs compared bit for bit across processes need one thread count: by default each process takes the cores
# idle when it starts, which ctest's other tests change (oneDNN's sums differ by thread count).
env = {**os.environ, "AMP_NUM_THREADS": "2"}


def run(*args):
    return subprocess.run([binary, "--device", "cpu", *args], capture_output=True, text=True, env=env)


with tempfile.TemporaryDirectory() as tmp:
    # Bad input: a clear message naming what was wrong, exit code 2, nothing written.
    (open(os.path.join(tmp, "short"), "w")).write("too short")
    os.mkdir(os.path.join(tmp, "empty"))
    json_path = os.path.join(tmp, "out.json")
    for args, message in ((["--width", "130"], "--width (130) must be a multiple of --heads (4)"),
                          (["--data", "/nonexistent"], "corpus folder '/nonexistent' not found"),
                          (["--data", os.path.join(tmp, "empty")], "has no text files"),
                          (["--data", tmp], "holds only 9 bytes of text"),
                          (["--eval-batches", "100000"], "is too short for --eval-batches 100000"),
                          (["--steps", "0"], "--steps must be an integer in [1, 10000000], got '0'"),
                          (["--attention", "flash"], "--attention must be fused or materialized, not 'flash'"),
                          (["--loss", "mse"], "--loss must be fused or plain, not 'mse'"),
                          (["--save", os.path.join(tmp, "c")], "--save works on one level: give --opt-level one level"),
                          (["--opt-level", "O0", "--generate", "5"], "--generate samples from a trained model: give "
                                                                     "--resume CHECKPOINT or --import FILE"),
                          (["--opt-level", "O0", "--save-interval", "5"], "--save-interval needs --save FILE"),
                          (["--train-tokens", "x.bin"], "--train-tokens and --val-tokens come together"),
                          (["--train-tokens", "/nonexistent", "--val-tokens", "v"], "cannot open token file "
                                                                                    "'/nonexistent'"),
                          (["--opt-level", "O0", "--resume", "/nonexistent"], "/nonexistent"),
                          (["--prompt", "\x01"], "--prompt: byte 1 at position 0 is not in the vocabulary of the "
                                                  "training text")):
        r = run(*args, "--json", json_path)
        assert r.returncode == 2 and message in r.stderr, (args, r.returncode, r.stderr)
        assert not os.path.exists(json_path), args

    steps, levels = 40, ["O0", "O2", "O1-bf16", "O2-fp8"]
    csv_path = os.path.join(tmp, "steps.csv")
    r = run("--data", data, "--steps", str(steps), "--eval-interval", "20", "--eval-batches", "4", "--sample", "30",
            "--opt-level", ",".join(levels), "--json", json_path, "--csv", csv_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    print(r.stdout)
    summary = json.load(open(json_path))
    assert summary["complete"] and summary["program"] == "char_lm" and summary["data_files"], summary.keys()
    assert 2.0 < summary["unigram_entropy"] < 5.0, summary["unigram_entropy"]
    got = {lv["opt_level"]: lv for lv in summary["levels"]}
    assert list(got) == levels, list(got)
    uniform = math.log(summary["vocab"])
    for name, lv in got.items():
        for key in ("val_loss", "train_loss", "tokens_per_second", "peak_bytes", "skipped_steps", "final_loss_scale",
                    "sample"):
            assert key in lv, (name, key)
        assert lv["val_loss"] < uniform - 1.0, (name, lv["val_loss"], uniform)  # learnt: ~3.3 vs ln 114 = 4.7
        assert abs(lv["val_loss"] / got["O0"]["val_loss"] - 1) < 0.03, (name, lv["val_loss"], got["O0"]["val_loss"])
        assert len(lv["sample"]) == 30 and lv["tokens_per_second"] > 0 and lv["peak_bytes"]["total"] > 0, name
        assert [e["step"] for e in lv["epochs"]] == [20, 40], lv["epochs"]
        for key in ("host_syncs_in_loop", "allocations_in_loop", "pageable_copies_in_loop"):
            assert lv[key] == 0, (name, key, lv[key])
        assert lv["launches_per_step"] > 50 and lv["step_ms"] > 0, (name, lv["launches_per_step"])
    assert got["O0"]["final_loss_scale"] == 1 and got["O2"]["final_loss_scale"] >= 1, got["O2"]["final_loss_scale"]
    # O2-fp8: every block's Linears in FP8 (the embedding and the tied head are the first and last layers),
    # each operand with a finite positive scale; the other levels have no FP8 state.
    fp8 = got["O2-fp8"]["fp8"]
    assert fp8["formats"] == "e4m3 forward, e5m2 gradients" and "delayed scaling" in fp8["recipe"], fp8
    assert len(fp8["layers"]) == 4 * summary["settings"]["layers"] and all(l["fp8"] for l in fp8["layers"]), fp8
    assert all(0 < s < 1e38 for l in fp8["layers"] for s in l["scales"].values()), fp8
    assert all(got[name]["fp8"] is None for name in ("O0", "O2", "O1-bf16"))
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == steps * len(levels), len(rows)
    assert all(math.isfinite(float(row["loss"])) for row in rows)

    # --graph, with dropout (its masks come from a counter on the device): the same training, bit for bit.
    losses = {}
    for graph in ([], ["--graph"]):
        r = run("--data", data, "--steps", "12", "--eval-interval", "6", "--eval-batches", "2", "--sample", "0",
                "--dropout", "0.1", "--opt-level", "O1-bf16", "--json", json_path, "--csv", csv_path, *graph)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        (lv,) = json.load(open(json_path))["levels"]
        assert (lv["graph_nodes"] > 50) == bool(graph) and lv["host_syncs_in_loop"] == 0, lv
        losses[bool(graph)] = ([row["loss"] for row in csv.DictReader(open(csv_path))], lv["val_loss"])
    assert losses[True] == losses[False], losses

    # The fused classifier loss (the default): the same training bit for bit, in less activation memory.
    runs = {}
    for loss in ("plain", "fused"):
        r = run("--data", data, "--steps", "8", "--eval-interval", "4", "--eval-batches", "2", "--sample", "0",
                "--opt-level", "O2", "--loss", loss, "--json", json_path, "--csv", csv_path)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        summary = json.load(open(json_path))
        assert summary["settings"]["loss"] == loss, summary["settings"]
        (lv,) = summary["levels"]
        runs[loss] = ([row["loss"] for row in csv.DictReader(open(csv_path))], lv["val_loss"],
                      lv["peak_bytes"]["activations"])
    assert runs["plain"][:2] == runs["fused"][:2], runs
    assert runs["fused"][2] < runs["plain"][2], runs

    # Resume: 16 steps straight = 8 steps saved every 4, then resumed to 16, bit for bit (O2: the loss scaler's
    # state; dropout: its counter), the validation loss too. Then generation from the checkpoint. `shape`: the
    # flags a resume takes from the checkpoint when they are not given.
    shape = ["--opt-level", "O2", "--layers", "2", "--width", "64", "--context", "32"]
    unshaped = ["--data", data, "--eval-interval", "4", "--eval-batches", "2", "--sample", "0", "--dropout", "0.1"]
    small = unshaped + shape
    ckpt, weights = os.path.join(tmp, "run.ckpt"), os.path.join(tmp, "run.safetensors")
    r = run(*small, "--steps", "16", "--csv", csv_path, "--json", json_path)
    assert r.returncode == 0, r.stderr
    straight = [row["loss"] for row in csv.DictReader(open(csv_path))]
    straight_val = json.load(open(json_path))["levels"][0]["val_loss"]
    # Activation checkpointing: the same 16 losses and validation loss as text, in less activation memory.
    plain_act = json.load(open(json_path))["levels"][0]["peak_bytes"]["activations"]
    r = run(*small, "--steps", "16", "--csv", csv_path, "--json", json_path, "--checkpoint-blocks", "yes")
    assert r.returncode == 0, r.stderr
    assert [row["loss"] for row in csv.DictReader(open(csv_path))] == straight
    summary = json.load(open(json_path))
    assert summary["levels"][0]["val_loss"] == straight_val and summary["settings"]["checkpoint_blocks"] is True
    assert summary["levels"][0]["peak_bytes"]["activations"] < plain_act, (summary, plain_act)
    r = run(*small, "--steps", "8", "--save", ckpt, "--save-interval", "4")
    assert r.returncode == 0 and os.path.exists(ckpt), r.stderr
    r = run(*small, "--steps", "16", "--resume", ckpt, "--csv", csv_path, "--json", json_path, "--export", weights,
            "--save", ckpt)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(csv_path)))
    assert [row["step"] for row in rows] == [str(i) for i in range(9, 17)], rows
    assert [row["loss"] for row in rows] == straight[8:], (rows, straight)
    assert json.load(open(json_path))["levels"][0]["val_loss"] == straight_val
    r = run(*small, "--steps", "8", "--resume", ckpt)
    assert r.returncode == 2 and "is at step 16: nothing left to train for --steps 8" in r.stderr, r.stderr
    # A shape flag given that disagrees with the checkpoint: an error naming both values.
    r = run(*[a if a != "64" else "128" for a in small], "--steps", "16", "--resume", ckpt)
    assert r.returncode == 2 and "was saved with --width 64; this run has --width 128" in r.stderr, r.stderr
    r = run(*unshaped, "--layers", "3", "--steps", "16", "--resume", ckpt)
    assert r.returncode == 2 and "was saved with --layers 2; this run has --layers 3" in r.stderr, r.stderr

    # SIGINT with --save: a checkpoint of the steps done, then the exit by the signal; it resumes.
    stopped = os.path.join(tmp, "stopped.ckpt")
    proc = subprocess.Popen([binary, "--device", "cpu", *small, "--steps", "100000", "--save", stopped],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if "val loss" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT and "interrupted: saved" in out, (proc.returncode, out[-300:], err)
    at = int(re.search(r"at step (\d+)", out).group(1))
    r = run(*unshaped, "--steps", str(at + 2), "--resume", stopped, "--csv", csv_path)  # its level and shape
    assert r.returncode == 0, r.stderr
    assert [row["step"] for row in csv.DictReader(open(csv_path))] == [str(at + 1), str(at + 2)]

    # Generation from the step-16 checkpoint: 80 characters (past the context of 32: the window restarts), with
    # and without the cache, and from the exported weights (transformers' layout, the fp32 masters): one text.
    texts = set()
    for source in (["--resume", ckpt], ["--resume", ckpt, "--kv-cache", "no"], ["--import", weights]):
        r = run(*small, "--steps", "16", *source, "--generate", "80", "--prompt", "The ", "--top-k", "10")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("The ") and len(r.stdout) == len("The ") + 80 + 1, repr(r.stdout)
        texts.add(r.stdout)
    assert len(texts) == 1, texts
    # The same text with the level and shape flags left to the checkpoint.
    r = run("--data", data, "--resume", ckpt, "--generate", "80", "--prompt", "The ", "--top-k", "10")
    assert r.returncode == 0 and r.stdout in texts, (r.stderr, r.stdout, texts)

    # llm.c token files from scripts/make_token_files.py (bytes as ids): training end to end, and the ids checked.
    tokens = os.path.join(tmp, "fortunes")
    tokenize = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make_token_files.py")
    files = sorted(f for f in os.listdir(data) if "." not in f)[:6]
    subprocess.run([sys.executable, tokenize, tokens, *(os.path.join(data, f) for f in files)], check=True,
                   capture_output=True)
    from_files = ["--train-tokens", tokens + "_train.bin", "--val-tokens", tokens + "_val.bin"]
    r = run(*from_files, "--steps", "40", "--eval-interval", "20", "--eval-batches", "2", "--sample", "20",
            "--opt-level", "O2-bf16", "--json", json_path)
    assert r.returncode == 0, r.stderr
    summary = json.load(open(json_path))
    assert summary["vocab"] == 256 and summary["tokens"] == "token files", summary
    assert summary["levels"][0]["val_loss"] < math.log(256) - 1.5, summary["levels"][0]["val_loss"]
    r = run(*from_files, "--vocab-size", "100", "--steps", "4", "--opt-level", "O0")
    assert r.returncode == 2 and "is outside the vocabulary [0, 100) (--vocab-size)" in r.stderr, r.stderr
print("char_lm check passed")
