#!/usr/bin/env python3
"""The GPU check's summary on one screen, from what scripts/gpu-check.sh left in its output folder: the GPU, each
stage's exit status and time, the tests (passed / failed / skipped), compute-sanitizer's findings, and per program
and opt level the accuracy (or loss), epoch time and memory, next to PyTorch's AMP on the same recipe.

usage: gpu_summary.py OUT_DIR BUILD_DIR      (exit status 0 only if everything passed with nothing skipped)"""
import glob
import json
import os
import re
import sys


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def main(out, build):
    ok = True
    print("=" * 78)
    print(f"amp GPU check: {read(os.path.join(out, 'gpu.txt')).strip() or 'no GPU reported by nvidia-smi'}")
    for line in read(os.path.join(out, "stages.txt")).splitlines():
        print(f"  {line}")
        status = re.search(r": exit (\d+) in", line)
        if (status and status.group(1) != "0") or "TIMED OUT" in line:
            ok = False

    tests = read(os.path.join(out, "tests.log"))
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", tests)
    skipped = len(re.findall(r"\*\*\*Skipped|\(Skipped\)", tests))
    if m:
        failed, total = int(m.group(2)), int(m.group(3))
        print(f"tests: {total - failed - skipped} passed, {failed} failed, {skipped} skipped (of {total})")
        ok = ok and failed == 0 and skipped == 0
        for name in re.findall(r"^\s*\d+ - (.*) \(Failed\)", tests, re.M)[:8]:
            print(f"  FAILED: {name}")
    else:
        print("tests: no ctest summary (see tests.log)")
        ok = False

    for log in sorted(glob.glob(os.path.join(out, "*check-*.log"))):
        text = read(log)
        found = re.search(r"ERROR SUMMARY: (\d+) error", text) or re.search(r"RACECHECK SUMMARY: (\d+) hazard", text)
        what = os.path.basename(log)[:-4]
        print(f"sanitizer {what}: {found.group(0) if found else 'no summary (see log)'}")
        ok = ok and bool(found) and found.group(1) == "0"

    for path in sorted(glob.glob(os.path.join(out, "*_gpu.json"))):
        summary = json.loads(read(path) or "{}")
        program = summary.get("program", os.path.basename(path))
        torch = {}
        for line in read(path.replace(".json", ".jsonl").replace(program, "pytorch_" + program)).splitlines():
            r = json.loads(line)
            torch[r["mode"]] = r
        print(f"{program} on {summary.get('device', '?')}:")
        print(f"  {'level':<9}{'metric':>10}{'epoch [s]':>11}{'memory MiB':>12}{'skipped':>9}  PyTorch (same recipe)")
        for lv in summary.get("levels", []):
            metric = lv.get("test_accuracy", lv.get("val_loss", lv.get("final_loss", float("nan"))))
            seconds = lv.get("epoch_seconds", lv.get("seconds", float("nan")))
            memory = lv.get("peak_bytes", {}).get("total", 0) / 2**20
            peer_mode = {"O0": "fp32", "O1": "fp16-amp", "O2": "fp16-amp", "O1-bf16": "bf16-autocast",
                         "O2-bf16": "bf16-autocast"}.get(lv["opt_level"])
            peer = torch.get(peer_mode)
            versus = ""
            if peer and "test_accuracy" in peer:
                versus = f"{peer_mode} {peer['test_accuracy']:.4f}, {peer['epoch_seconds']:.3f} s"
            elif peer:  # char_lm: validation loss and tokens/s against amp's tokens/s
                versus = (f"{peer_mode} {peer['val_loss']:.4f}, {peer['tokens_per_second']:.0f} tok/s "
                          f"(amp {lv['tokens_per_second']:.0f})")
            print(f"  {lv['opt_level']:<9}{metric:>10.4f}{seconds:>11.3f}{memory:>12.2f}"
                  f"{lv.get('skipped_steps', 0):>9}  {versus}")
    print("=" * 78)
    print("gpu-check: PASSED" if ok else "gpu-check: FAILED (logs in " + out + ")")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
