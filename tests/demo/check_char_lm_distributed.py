"""char_lm as 2 MPI ranks (mpirun -np 2 char_lm --distributed yes, batch 8 per rank) against one process with the
global batch of 16: the same windows in the same order, so at O0 the validation loss after 30 steps agrees to
within fp32 summation order (1e-4 relative) and at O2-bf16 within 1% (no dropout: each rank draws its own masks).
With dropout 0.1 and --checkpoint-blocks yes the 2 ranks give the plain 2-rank run's losses exactly, and so does
--zero 1 (ZeRO-1: each rank keeps the masters and moments of its shard), with less master + optimizer memory per rank,
the same exported weights (the masters gathered to rank 0), and a checkpoint that resumes on 2 ranks to the same
losses and loads into one process. Also: only rank 0 prints and writes, the JSON's world_size, and an error on the
ranks ending the job with its message."""
import csv
import json
import os
import subprocess
import sys
import tempfile

mpirun, binary, data = sys.argv[1], sys.argv[2], sys.argv[3]
if not os.path.isdir(data):
    print(f"[amp-skip] the fortunes text is not at {data} (apt-get install fortunes)")
    sys.exit(0)
env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
common = ["--data", data, "--device", "cpu", "--steps", "30", "--eval-interval", "30", "--eval-batches", "2",
          "--sample", "0", "--layers", "2", "--width", "64", "--heads", "4", "--context", "32", "--warmup", "5"]
mpi = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2"]
resume_args = list(common)
del resume_args[resume_args.index("--steps"):resume_args.index("--steps") + 2]
resume_args[resume_args.index("--warmup") + 1] = "40"
resume_args[resume_args.index("--eval-interval") + 1] = "15"


def run(args, timeout=600):
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def losses(path):
    with open(path) as f:
        return [row["loss"] for row in csv.DictReader(f)]


def kept(path):  # peak bytes of masters and optimizer state (rank 0)
    peak = json.load(open(path))["levels"][0]["peak_bytes"]
    return peak["master"] + peak["optimizer"]


with tempfile.TemporaryDirectory() as tmp:
    for level, bound in (("O0", 1e-4), ("O2-bf16", 1e-2)):
        one_json, two_json = os.path.join(tmp, "one.json"), os.path.join(tmp, "two.json")
        r = run([binary, *common, "--opt-level", level, "--batch-size", "16", "--threads", "1", "--json", one_json])
        assert r.returncode == 0, r.stderr
        csv_two, csv_ckpt = os.path.join(tmp, "two.csv"), os.path.join(tmp, "ckpt.csv")
        r = run([*mpi, binary, *common, "--opt-level", level, "--distributed", "--batch-size", "8", "--json", two_json])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert r.stdout.count("results on") == 1, "only rank 0 prints the table"
        assert "2 ranks x batch 8 = global batch 16" in r.stdout, r.stdout[:500]
        one, two = json.load(open(one_json)), json.load(open(two_json))
        assert one["world_size"] == 1 and two["world_size"] == 2 and two["global_batch_size"] == 16, two
        a, b = one["levels"][0]["val_loss"], two["levels"][0]["val_loss"]
        assert abs(a - b) <= bound * a, (level, a, b)
        assert b < 3.6, (level, b)  # it learns (ln of the vocabulary is about 4.7)
        print(f"{level}: validation loss 1 process {a:.6f}, 2 ranks {b:.6f} (relative {abs(a - b) / a:.1e})")
        r = run([*mpi, binary, *common, "--opt-level", level, "--distributed", "--batch-size", "8", "--csv", csv_ckpt,
                 "--checkpoint-blocks", "yes", "--dropout", "0.1"])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        plain_json, plain_st = os.path.join(tmp, "plain.json"), os.path.join(tmp, "plain.safetensors")
        r = run([*mpi, binary, *common, "--opt-level", level, "--distributed", "--batch-size", "8", "--csv", csv_two,
                 "--dropout", "0.1", "--json", plain_json, "--export", plain_st])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert losses(csv_ckpt) == losses(csv_two), level
        # ZeRO-1: the same losses, bit for bit as text, and the same exported fp32 weights.
        csv_zero, zero_json, zero_st = (os.path.join(tmp, n) for n in ("zero.csv", "zero.json", "zero.safetensors"))
        r = run([*mpi, binary, *common, "--opt-level", level, "--distributed", "--zero", "1", "--batch-size", "8",
                 "--csv", csv_zero, "--dropout", "0.1", "--json", zero_json, "--export", zero_st])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "ZeRO-1" in r.stdout[:500], r.stdout[:500]
        assert json.load(open(zero_json))["settings"]["zero"] == 1
        assert losses(csv_zero) == losses(csv_two), level
        assert open(zero_st, "rb").read() == open(plain_st, "rb").read(), level
        ratio = kept(zero_json) / kept(plain_json)
        assert ratio <= 0.55, (level, ratio)
        # Resume: 30 steps straight = 15 steps saved, then resumed to 30, on 2 ranks with --zero 1 (warm-up over
        # all 30 steps and evaluations at 15 and 30, so the 15-step run's rates and dropout stream are the straight run's).
        ckpt, csv_straight, csv_resumed = (os.path.join(tmp, n) for n in ("zero.ckpt", "straight.csv", "resumed.csv"))
        zero = [*mpi, binary, *resume_args, "--opt-level", level, "--distributed", "--zero", "1", "--batch-size", "8",
                "--dropout", "0.1"]
        for args in (["--steps", "30", "--csv", csv_straight], ["--steps", "15", "--save", ckpt],
                     ["--steps", "30", "--resume", ckpt, "--csv", csv_resumed]):
            r = run([*zero, *args])
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert losses(csv_resumed) == losses(csv_straight)[15:], level
        # The gathered checkpoint is the one-process format: one process resumes from it.
        r = run([binary, *common, "--opt-level", level, "--batch-size", "16", "--threads", "1", "--resume", ckpt])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        print(f"{level}: --zero 1 = 2 ranks plain (30 losses, exported weights); master + optimizer per rank "
              f"{ratio:.3f}x; resumed at step 15 on 2 ranks: the same 15 losses; loads into one process")
    # Generation is one process's job.
    r = run([*mpi, binary, *common, "--distributed", "--batch-size", "8", "--generate", "5", "--import", one_json,
             "--opt-level", "O0"],
            timeout=120)
    assert r.returncode != 0 and "--generate runs in one process, not under --distributed" in r.stderr, r.stderr[-2000:]
    r = run([binary, *common, "--zero", "1"], timeout=120)
    assert r.returncode != 0 and "--zero 1 shards over the ranks of --distributed yes" in r.stderr, r.stderr[-2000:]
    # A bad flag on the ranks: the job ends with the message, no hang.
    r = run([*mpi, binary, *common, "--distributed", "--batch-size", "8", "--width", "66"], timeout=120)
    assert r.returncode != 0 and "--width (66) must be a multiple of --heads (4)" in r.stderr, r.stderr[-2000:]
print("char_lm distributed check passed")
