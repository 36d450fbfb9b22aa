#!/usr/bin/env python3
"""What README's first command leaves behind, checked: the demo's JSON (every level finished and learned), its
per-step CSV (every level's steps) and the plot (a PNG and an SVG that are images, not empty files).

usage: check_demo_outputs.py OUT_DIR [LEVELS...]   (default: the seven levels)"""
import csv
import json
import math
import os
import sys

LEVELS = ["O0", "O1", "O2", "O3", "O1-bf16", "O2-bf16", "O2-fp8"]


def fail(message):
    sys.exit(f"demo output check: {message}")


def main():
    out = sys.argv[1]
    levels = sys.argv[2:] or LEVELS
    path = os.path.join(out, "fashion_mnist.json")
    with open(path) as f:
        summary = json.load(f)
    if summary.get("complete") is not True:
        fail(f"{path} says the run did not complete")
    ran = [entry["opt_level"] for entry in summary["levels"]]
    if ran != levels:
        fail(f"{path} has levels {ran}, expected {levels}")
    for entry in summary["levels"]:
        accuracy = entry["test_accuracy"]
        if not 0.5 < accuracy <= 1.0:  # chance is 0.1; a level that trained reaches 0.7 on a 6000-image epoch
            fail(f"{entry['opt_level']}: test accuracy {accuracy} (chance is 0.1)")
        if not entry["epochs"] or entry["samples_per_second"] <= 0:
            fail(f"{entry['opt_level']}: no epochs or no speed in {path}")

    path = os.path.join(out, "fashion_mnist.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    steps = {level: 0 for level in levels}
    for row in rows:
        if row["level"] not in steps:
            fail(f"{path}: a row of unknown level {row['level']!r}")
        steps[row["level"]] += 1
        if not (math.isfinite(float(row["loss"])) and float(row["loss"]) > 0):
            fail(f"{path}: loss {row['loss']} at {row['level']} step {row['step']}")
    batches = -(-summary["settings"]["train_images"] // summary["settings"]["batch_size"])
    expected = batches * summary["settings"]["epochs"]
    for level, count in steps.items():
        if count != expected:
            fail(f"{path}: {count} steps of {level}, expected {expected}")

    for name, magic in (("fashion_mnist.png", b"\x89PNG\r\n\x1a\n"), ("fashion_mnist.svg", b"<?xml")):
        path = os.path.join(out, name)
        with open(path, "rb") as f:
            head = f.read(8)
        if not head.startswith(magic) or os.path.getsize(path) < 10_000:
            fail(f"{path} is not a drawn {name.rsplit('.', 1)[1].upper()} ({os.path.getsize(path)} bytes)")
        if os.path.getmtime(path) < os.path.getmtime(os.path.join(out, "fashion_mnist.json")):
            fail(f"{path} is older than the JSON it should draw (left from an earlier run?)")
    print(f"demo outputs check passed: {len(levels)} levels, {expected} steps each, JSON, CSV, PNG and SVG")


main()
