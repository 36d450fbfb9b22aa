#!/usr/bin/env python3
"""The tables and the plot of bench/compile_time.sh, from its CSV.

usage: compile_time_report.py compile_time.csv compile_time.png"""
import csv, statistics, sys
from collections import defaultdict
rows = list(csv.DictReader(open(sys.argv[1])))
programs = defaultdict(list)
for r in rows:
    if r["kind"] == "program":
        programs[(r["name"], r["compiler"])].append(float(r["seconds"]))
print("\nprogram        compiler   median s   spread s")
for (name, compiler), s in programs.items():
    print(f"{name:<14} {compiler:<8} {statistics.median(s):9.1f} {max(s) - min(s):10.1f}")
units = [r for r in rows if r["kind"] == "unit"]
if units:
    total = sum(float(r["seconds"]) for r in units)
    print(f"\nthe last build: {len(units)} translation units, {total / 60:.1f} CPU-minutes; the slowest:")
    for r in units[:15]:
        print(f"  {float(r['seconds']):6.1f} s  {r['name']}")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("no matplotlib for this python: the tables above stand, no plot (apt-get install python3-matplotlib)")
fig, axes = plt.subplots(1, 2 if units else 1, figsize=(13 if units else 6, 5), squeeze=False)
labels = [f"{n}\n{c}" for n, c in programs]
axes[0][0].bar(labels, [statistics.median(s) for s in programs.values()], color="tab:blue")
axes[0][0].set_ylabel("seconds (compile + link)")
axes[0][0].set_title("a user's program, one policy and one backend")
if units:
    top = units[:15][::-1]
    def label(path):  # "target: file", the target from CMake's "<target>.dir" folder
        parts = path.split("/")
        target = next((p[:-4] for p in parts if p.endswith(".dir")), "")
        return f"{target}: {parts[-1]}" if target else parts[-1]
    axes[0][1].barh([label(r["name"]) for r in top], [float(r["seconds"]) for r in top], color="tab:orange")
    axes[0][1].set_xlabel("seconds")
    axes[0][1].set_title("amp's build: the slowest translation units")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print(f"\nwrote {sys.argv[1]} and {sys.argv[2]}")
