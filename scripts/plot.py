#!/usr/bin/env python3
"""Draws what the examples write: per opt level, the smoothed training loss, the test metric per epoch, the loss
scale, the epoch time and the peak memory by category, side by side in one figure (PNG and SVG).

usage: plot.py RESULTS.json STEPS.csv OUT.png     (the SVG goes beside the PNG)
       plot.py --numerics NUMERICS.csv OUT.png

RESULTS.json and STEPS.csv are what fashion_mnist (or char_lm) write with --json and --csv. With --numerics N they
also write STEPS_numerics.csv; found beside STEPS.csv, it is drawn too, as OUT_numerics.png: per level, heat maps of
tensors x steps (the fraction of each tensor that is zero or subnormal in its stored type, log2 of its amax, and for
FP8 operands the share of the format's range their scaled amax reaches)."""
import csv
import json
import math
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1))]
MEMORY = ["weights", "master", "grads", "optimizer", "activations", "workspace", "data"]


def smooth(values, span):
    """Exponential moving average with a bias correction, so the curve starts where the data starts."""
    out, avg, weight, alpha = [], 0.0, 0.0, 2.0 / (span + 1)
    for v in values:
        avg = (1 - alpha) * avg + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(avg / weight)
    return out


def main(results_path, steps_path, out_png):
    with open(results_path) as f:
        results = json.load(f)
    steps = defaultdict(lambda: {"epoch": [], "loss": [], "scale": []})
    with open(steps_path) as f:
        for row in csv.DictReader(f):
            s = steps[row["level"]]
            s["epoch"].append(int(row["epoch"]))
            s["loss"].append(float(row["loss"]))
            s["scale"].append(float(row["loss_scale"]))
    levels = results["levels"]
    names = [lv["opt_level"] for lv in levels]
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    style = {n: STYLES[i % len(STYLES)] for i, n in enumerate(names)}

    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    title = f"{results.get('program', 'amp')} on {results.get('device', '?')}"
    if not results.get("complete", True):
        title += " (interrupted: finished levels only)"
    fig.suptitle(title, fontsize=14)
    unit = results.get("epoch_name", "epoch")  # char_lm's "epochs" are evaluation intervals

    ax = axes[0][0]
    for n in names:
        s = steps.get(n)
        if not s or not s["loss"]:
            continue
        per_epoch = max(1, len(s["loss"]) // max(s["epoch"]))
        x = [i / per_epoch for i in range(len(s["loss"]))]
        ax.plot(x, smooth(s["loss"], max(5, per_epoch // 4)), color=colors[n], linestyle=style[n], label=n, lw=1.6)
    ax.set_yscale("log")
    ax.set_xlabel(unit)
    ax.set_title("training loss (smoothed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()

    ax = axes[0][1]
    metric = "test_accuracy" if levels and "test_accuracy" in levels[0]["epochs"][0] else "val_loss"
    for n, lv in zip(names, levels):
        ep = lv["epochs"]
        ax.plot([e["epoch"] for e in ep], [e[metric] for e in ep], color=colors[n], linestyle=style[n], marker="o",
                ms=4, label=n, lw=1.6)
    ax.set_xlabel(unit)
    ax.set_title(metric.replace("_", " ") + " per " + unit)
    ax.grid(True, alpha=0.3)
    ax.legend()

    ax = axes[0][2]
    for n in names:
        s = steps.get(n)
        if s and s["scale"]:
            per_epoch = max(1, len(s["scale"]) // max(s["epoch"]))
            ax.step([i / per_epoch for i in range(len(s["scale"]))], s["scale"], where="post", color=colors[n],
                    linestyle=style[n], label=n, lw=1.6)
    ax.set_yscale("log", base=2)
    ax.set_xlabel(unit)
    ax.set_title("loss scale")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()

    ax = axes[1][0]
    times = [lv["epoch_seconds"] for lv in levels]
    bars = ax.bar(names, times, color=[colors[n] for n in names])
    ax.bar_label(bars, fmt="%.2f s")
    ax.set_title(f"median {unit} time [s]")
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1][1]
    bottom = [0.0] * len(levels)
    for i, kind in enumerate(MEMORY):
        mib = [lv["peak_bytes"].get(kind, 0) / 2**20 for lv in levels]
        ax.bar(names, mib, bottom=bottom, label=kind, color=plt.cm.Set2(i))
        bottom = [b + m for b, m in zip(bottom, mib)]
    ax.set_title("peak memory by category [MiB]")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1][2]
    ax.axis("off")
    final = "test_accuracy" if "test_accuracy" in levels[0] else "val_loss"
    rows = [[n, f"{lv[final]:.4f}", f"{lv['epoch_seconds']:.3f}", f"{lv['skipped_steps']}",
             f"{lv['final_loss_scale']:g}"] for n, lv in zip(names, levels)]
    table = ax.table(cellText=rows, colLabels=["level", final.replace("_", " "), f"{unit.split()[-1]} [s]", "skipped",
                                               "scale"],
                     loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(11)
    table.scale(1, 1.8)
    ax.set_title("final figures")

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out_png, dpi=110)
    fig.savefig(os.path.splitext(out_png)[0] + ".svg")
    print(f"plot: {out_png} (and .svg)")
    numerics = os.path.splitext(steps_path)[0] + "_numerics.csv"
    if os.path.exists(numerics):
        plot_numerics(numerics, os.path.splitext(out_png)[0] + "_numerics.png")


def heat_map(ax, fig, rows, value, label, cmap, vmin=None, vmax=None):
    """Tensors (in the order they first appear) x report steps, coloured by value(row)."""
    tensors, steps = [], sorted({int(r["step"]) for r in rows})
    for r in rows:
        key = f"{r['tensor']} ({r['kind']})"
        if key not in tensors:
            tensors.append(key)
    grid = [[math.nan] * len(steps) for _ in tensors]
    for r in rows:
        grid[tensors.index(f"{r['tensor']} ({r['kind']})")][steps.index(int(r["step"]))] = value(r)
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_yticks(range(len(tensors)))
    ax.set_yticklabels(tensors, fontsize=max(4, min(8, 400 // max(len(tensors), 1))))
    ticks = list(range(0, len(steps), max(1, len(steps) // 8)))
    ax.set_xticks(ticks)
    ax.set_xticklabels([steps[i] for i in ticks])
    ax.set_xlabel("step")
    fig.colorbar(image, ax=ax, label=label)


def plot_numerics(path, out_png):
    by_level = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            by_level[row["level"]].append(row)
    if not by_level:
        print(f"plot: {path} has no rows")
        return
    kinds = [("values at risk: zero or subnormal", lambda r: r["kind"] != "fp8",
              lambda r: float(r["zero"]) + float(r["subnormal"]), "fraction", "magma_r", 0.0, 1.0),
             ("log2 amax", lambda r: r["kind"] != "fp8",
              lambda r: math.log2(float(r["amax"])) if float(r["amax"]) > 0 else math.nan, "log2 |x| max", "viridis",
              None, None),
             ("FP8 operands: amax x scale / format max", lambda r: r["kind"] == "fp8", lambda r: float(r["range"]),
              "share of range", "cividis", 0.0, 1.0)]
    kinds = [k for k in kinds if any(k[1](r) for rows in by_level.values() for r in rows)]
    levels = list(by_level)
    fig, axes = plt.subplots(len(kinds), len(levels), figsize=(6.5 * len(levels), 7 * len(kinds)), squeeze=False)
    for j, level in enumerate(levels):
        for i, (title, keep, value, label, cmap, vmin, vmax) in enumerate(kinds):
            rows = [r for r in by_level[level] if keep(r)]
            ax = axes[i][j]
            if not rows:
                ax.axis("off")
                continue
            heat_map(ax, fig, rows, value, label, cmap, vmin, vmax)
            ax.set_title(f"{level}: {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    fig.savefig(os.path.splitext(out_png)[0] + ".svg")
    print(f"plot: {out_png} (and .svg)")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--numerics":
        plot_numerics(*sys.argv[2:])
    elif len(sys.argv) == 4:
        main(*sys.argv[1:])
    else:
        sys.exit(__doc__)
