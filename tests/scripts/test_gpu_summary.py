#!/usr/bin/env python3
"""The GPU check's plan and its summary's judgement, without a GPU or a build: scripts/gpu-check.sh --plan fits its
deadline (and refuses one it does not fit), and scripts/gpu_summary.py, on made-up work folders laid out as the run
leaves them, passes a run whose optional stages were cut or refused (warnings), fails one whose essential stage was
cut, reads the [amp-versions] line and names an old cuDNN or driver as the likely cause of a failure.

usage: test_gpu_summary.py (run by ctest and by scripts/gpu-check.sh --dry-run)"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHECK = os.path.join(ROOT, "scripts", "gpu-check.sh")
SUMMARY = os.path.join(ROOT, "scripts", "gpu_summary.py")
# The line CudaVersions::line() prints (include/amp/backend/cuda/versions.cuh).
VERSIONS = "[amp-versions] driver=13000 runtime=13000 cudnn=91900 cudnn_built=91900 cudnn_cuda=13000 " \
           "cublas=130100 cublas_built=130000"


def plan_table():
    """The stage table as the script holds it (the heredoc of plan_table)."""
    with open(CHECK) as f:
        text = f.read()
    table = re.search(r"<<'PLAN'\n(.*?)\nPLAN\n", text, re.S).group(1)
    return [line.split(None, 3) for line in table.splitlines()]


def doctest_log(cases=20, failed=0):
    return (f"[doctest] test cases: {cases} | {cases - failed} passed | {failed} failed | 0 skipped\n"
            f"[doctest] assertions: {cases * 10} | {cases * 10} passed | {failed} failed |\n")


def program_json(metric, graph):
    levels = [{"opt_level": lv, metric: 0.5, "step_ms": 1.0 if graph else 2.0, "launches_per_step": 40,
               "graph_nodes": 40 if graph else 0} for lv in ("O0", "O2", "O2-bf16")]
    return {"device": "cuda", "levels": levels}


class Run:
    """A work folder as scripts/gpu-check.sh leaves it after a run where every stage passed."""

    def __init__(self, folder):
        self.dir = folder
        self.plan = plan_table()
        self.write("plan.txt", "\n".join(" ".join(row) for row in self.plan) + "\n")
        self.write("gpu.txt", "NVIDIA H100 80GB HBM3, 9.0, 580.159.04, 81559 MiB\n")
        self.write("machine.txt", "kernel 6.18.44-fc-v310-gpu\n")
        self.outcome = {row[0]: f"exit 0 in 3 s (limit {row[1]} s, {row[2]})" for row in self.plan}
        for name, *_ in self.plan:
            if name.startswith("test-"):
                self.write(f"{name}.log", (VERSIONS + "\n" if "backend" in name else "") + doctest_log())
        for program, metric in (("seed_linear", "final_loss"), ("fashion_mnist", "test_accuracy"),
                                ("char_lm", "val_loss")):
            for mode in ("eager", "graph"):
                self.write(f"{program}.{mode}.json", json.dumps(program_json(metric, mode == "graph")))
        self.write("row_ops.json", json.dumps({"rows": [{"op": "layernorm forward", "type": "bf16", "shape":
                                                          "16384x768", "gb_per_s": 2400, "of_copy": 0.8}]}))

    def write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def summarize(self):
        """Writes stages.txt (stages without an outcome were never reached) and runs the summary."""
        self.write("stages.txt", "".join(f"{n}: {o}\n" for n, o in self.outcome.items() if o))
        done = subprocess.run([sys.executable, SUMMARY, self.dir], capture_output=True, text=True)
        with open(os.path.join(self.dir, "results.json")) as f:
            return done.returncode, done.stdout, json.load(f)


class Plan(unittest.TestCase):
    def test_fits_its_deadline(self):
        done = subprocess.run(["bash", CHECK, "--plan"], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        m = re.match(r"gpu-check plan: (\d+) s of (\d+) s", done.stdout)
        self.assertTrue(m, done.stdout)
        total, deadline = int(m.group(1)), int(m.group(2))
        self.assertLessEqual(total, deadline)
        self.assertLessEqual(deadline, 450)
        self.assertEqual(total, sum(int(row[1]) for row in plan_table()))

    def test_refuses_a_deadline_it_does_not_fit(self):
        done = subprocess.run(["bash", CHECK, "--plan"], capture_output=True, text=True,
                              env={**os.environ, "GPU_CHECK_SECONDS": "200"})
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("does not fit", done.stderr)

    def test_essentials_first_and_every_test_binary(self):
        kinds = [row[2] for row in plan_table()]
        self.assertEqual(kinds, sorted(kinds))  # "essential" < "optional"
        names = {row[0] for row in plan_table()}
        for binary in ("backend", "training", "capture", "parallel"):
            self.assertIn(f"test-amp_cuda_{binary}_tests", names)


class Summary(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.run_ = Run(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def test_cut_or_refused_optional_stages_warn(self):
        self.run_.outcome["pytorch"] = "exit 124 in 30 s (limit 30 s, optional)"
        self.run_.outcome["sanitizer-backend"] = "exit 77 in 1 s (limit 15 s, optional)"
        self.run_.write("sanitizer-backend.log", "refused: the device is not supported (gVisor?)\n")
        self.run_.outcome["sanitizer-capture"] = None  # the call ended first
        rc, text, results = self.run_.summarize()
        self.assertEqual(rc, 0, text)
        self.assertIn("gpu-check: PASSED (3 warnings)", text)
        self.assertEqual(results["stages"]["pytorch"]["status"], "cut")
        self.assertEqual(results["stages"]["sanitizer-backend"]["status"], "refused")
        self.assertEqual(results["stages"]["sanitizer-capture"]["status"], "not reached")

    def test_a_cut_essential_stage_fails(self):
        self.run_.outcome["test-amp_cuda_training_tests"] = "exit 124 in 75 s (limit 75 s, essential)"
        rc, text, results = self.run_.summarize()
        self.assertEqual(rc, 1)
        self.assertIn("essential stage test-amp_cuda_training_tests: cut for time", results["problems"])

    def test_essential_stages_never_reached_fail(self):
        for name in ("programs", "row-ops"):
            self.run_.outcome[name] = None
        rc, _, results = self.run_.summarize()
        self.assertEqual(rc, 1)
        self.assertIn("essential stage row-ops: never reached", results["problems"])

    def test_an_optional_stage_that_ran_and_failed_fails(self):
        self.run_.outcome["sanitizer-capture"] = "exit 9 in 8 s (limit 15 s, optional)"
        self.run_.write("sanitizer-capture.log", "========= ERROR SUMMARY: 2 errors\n")
        rc, _, results = self.run_.summarize()
        self.assertEqual(rc, 1)
        self.assertEqual(results["sanitizer"], [{"run": "sanitizer-capture", "errors": 2}])

    def test_versions_are_read(self):
        rc, text, results = self.run_.summarize()
        self.assertEqual(rc, 0, text)
        self.assertEqual(results["versions"], {"driver": 13000, "runtime": 13000, "cudnn": 91900, "cudnn_built": 91900,
                                               "cudnn_cuda": 13000, "cublas": 130100, "cublas_built": 130000})
        self.assertIn("cuDNN 9.19.0 (built with 9.19.0), cuBLAS 13.1.0 (built with 13.0.0)", text)
        self.assertEqual(results["likely_causes"], [])

    def test_an_old_cudnn_is_named_as_the_cause(self):
        self.run_.write("test-amp_cuda_backend_tests.log", VERSIONS.replace("cudnn=91900", "cudnn=91000") + "\n"
                        + "TEST CASE:  cuda: cuDNN convolution passes against an FP64 direct convolution<float>\n"
                        + doctest_log(failed=2))
        self.run_.outcome["test-amp_cuda_backend_tests"] = "exit 1 in 20 s (limit 45 s, essential)"
        rc, text, results = self.run_.summarize()
        self.assertEqual(rc, 1)
        self.assertIn("likely cause: cuDNN 9.10.0 is loaded, older than the 9.19.0 amp was built against", text)

    def test_an_old_library_that_failed_nothing_warns(self):
        self.run_.write("test-amp_cuda_backend_tests.log", VERSIONS.replace("cudnn=91900", "cudnn=91000") + "\n"
                        + doctest_log())
        rc, text, results = self.run_.summarize()
        self.assertEqual(rc, 0, text)
        self.assertTrue(any("cuDNN 9.10.0" in w for w in results["warnings"]))

    def test_a_cudnn_for_another_cuda_is_named(self):
        self.run_.write("test-amp_cuda_backend_tests.log", VERSIONS.replace("cudnn_cuda=13000", "cudnn_cuda=12080") + "\n")
        self.run_.outcome["test-amp_cuda_backend_tests"] = "exit 1 in 1 s (limit 45 s, essential)"
        rc, _, results = self.run_.summarize()
        self.assertEqual(rc, 1)
        self.assertTrue(any("built for CUDA 12.8" in c for c in results["likely_causes"]), results["likely_causes"])

    def test_an_old_driver_is_named(self):
        self.run_.write("gpu.txt", "NVIDIA H100 80GB HBM3, 9.0, 570.86.15, 81559 MiB\n")
        self.run_.write("test-amp_cuda_backend_tests.log", VERSIONS.replace("driver=13000", "driver=12080") + "\n")
        self.run_.outcome["test-amp_cuda_backend_tests"] = "exit 1 in 1 s (limit 45 s, essential)"
        rc, _, results = self.run_.summarize()
        self.assertEqual(rc, 1)
        self.assertIn("the driver supports CUDA 12.8, older than the runtime 13.0 needs", results["likely_causes"])
        self.assertIn("the driver 570 is older than CUDA 13's runtime needs (580)", results["likely_causes"])

    def test_an_empty_run_fails(self):
        with tempfile.TemporaryDirectory() as empty:
            done = subprocess.run([sys.executable, SUMMARY, empty], capture_output=True, text=True)
            self.assertEqual(done.returncode, 1)
            self.assertIn("gpu-check: FAILED", done.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=1)
