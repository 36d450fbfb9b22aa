#!/usr/bin/env python3
"""The GPU check's summary on one screen, from what scripts/gpu-check.sh left in its work folder: the GPU and the
library versions loaded there, each stage of the plan (plan.txt) against its outcome (stages.txt), the tests (none
may fail or skip), compute-sanitizer's findings, each program eager against its captured CUDA graph (the same
training, the step's time, launches and graph nodes, the host work in the loop), and PyTorch's AMP on the same
recipes.

An essential stage that did not pass is a failure; an optional one cut for time, refused by the machine (exit 77)
or never reached is a warning. A library loaded older than the one amp was built against is named as the likely
cause of what failed.

usage: gpu_summary.py WORK_DIR
Writes WORK_DIR/summary.txt and WORK_DIR/results.json, prints the summary; exit status 0 only if every essential
stage passed and nothing ran and failed."""
import csv
import glob
import json
import math
import os
import re
import sys

PROGRAMS = {  # program: (the metric its JSON reports per level, how close --graph must come to eager)
    "seed_linear": ("final_loss", 1e-3),
    "fashion_mnist": ("test_accuracy", 5e-3),
    "char_lm": ("val_loss", 1e-2),
}
PEER = {"O0": "fp32", "O1": "fp16-amp", "O2": "fp16-amp", "O1-bf16": "bf16-autocast", "O2-bf16": "bf16-autocast"}
HOST_WORK = ("host_syncs_in_loop", "allocations_in_loop", "pageable_copies_in_loop")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def load_json(path):
    try:
        return json.loads(read(path))
    except ValueError:
        return None


class Summary:
    def __init__(self):
        self.lines, self.problems, self.warnings, self.causes = [], [], [], []

    def say(self, line=""):
        self.lines.append(line)

    def fail(self, why):
        self.problems.append(why)
        self.say(f"  FAILED: {why}")


CUT, REFUSED = (124, 137), 77  # timeout's exit statuses; a stage's own word that the machine refuses it
OUTCOME = re.compile(r"(\S+): (?:exit (\d+) in (\d+) s|(not run)[^(]*)(?: \(limit (\d+) s, (\w+)\))?")


def plan(work):
    """plan.txt: the stage table as the run read it (name, limit, essential|optional, command)."""
    rows = []
    for line in read(os.path.join(work, "plan.txt")).splitlines():
        fields = line.split(None, 3)
        if len(fields) >= 3 and fields[1].isdigit():
            rows.append({"stage": fields[0], "limit": int(fields[1]), "kind": fields[2]})
    return rows


def stages(work, s):
    """Each planned stage's status: passed, failed, cut (for time), refused or not reached (the call ended first)."""
    seen = {}
    for line in read(os.path.join(work, "stages.txt")).splitlines():
        m = OUTCOME.match(line)
        if m:
            seen[m.group(1)] = {"exit": int(m.group(2)) if m.group(2) else None,
                                "seconds": int(m.group(3)) if m.group(3) else 0,
                                "given": int(m.group(5)) if m.group(5) else None}
    planned = plan(work)
    if not planned:
        s.fail("no plan.txt: the check did not start")
    names = [p["stage"] for p in planned]
    planned += [{"stage": n, "limit": 0, "kind": "essential"} for n in seen if n not in names]
    result = {}
    for p in planned:
        name, kind, o = p["stage"], p["kind"], seen.get(p["stage"])
        if o is None:
            status = "not reached"
        elif o["exit"] is None:
            status = "cut"  # not started: no time left
        elif o["exit"] == 0:
            status = "passed"
        elif o["exit"] in CUT:
            status = "cut"
        elif o["exit"] == REFUSED:
            status = "refused"
        else:
            status = "failed"
        took = f"{o['seconds']:>4} s of {o['given'] if o['given'] is not None else p['limit']:>3} s" if o else " " * 13
        s.say(f"  {name:<30} {status:<12} {took}  {kind}" + (f" (exit {o['exit']})" if status == "failed" else ""))
        result[name] = {**p, "status": status, **(o or {})}
        if status == "passed":
            continue
        why = {"cut": "cut for time", "refused": "refused by this machine", "not reached": "never reached",
               "failed": f"exited with {o['exit'] if o else '?'}"}[status]
        if kind == "optional" and status != "failed":
            s.warnings.append(f"optional stage {name}: {why}")
        else:
            s.problems.append(f"{kind} stage {name}: {why}")
    return result


def ran(status, name):
    """Whether a stage ran to its end (its outputs are whole), or was never planned (an old work folder)."""
    return status.get(name, {}).get("status", "passed") in ("passed", "failed")


VERSIONS = re.compile(r"^\[amp-versions\]\s+(.*)$", re.M)


def cuda_version(v):  # 13000 -> 13.0 (cudaRuntimeGetVersion, cudaDriverGetVersion)
    return f"{v // 1000}.{v % 1000 // 10}"


def triple(v):  # 91900 -> 9.19.0 (cuDNN 9, cuBLAS, NCCL)
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def versions(work, s, gpu):
    """The line amp_cuda_backend_tests' first case prints, and what in it would explain failures."""
    m = VERSIONS.search(read(os.path.join(work, "test-amp_cuda_backend_tests.log")))
    if not m:
        s.say("  not reported (no [amp-versions] line in test-amp_cuda_backend_tests.log)")
        return {}
    v = {}
    for field in m.group(1).split():
        key, _, value = field.partition("=")
        if value.lstrip("-").isdigit():
            v[key] = int(value)
    shown = []
    for key, name, form in (("driver", "driver (CUDA)", cuda_version), ("runtime", "runtime", cuda_version),
                            ("cudnn", "cuDNN", triple), ("cublas", "cuBLAS", triple), ("nccl", "NCCL", triple)):
        if key in v:
            built = f" (built with {form(v[key + '_built'])})" if key + "_built" in v else ""
            shown.append(f"{name} {form(v[key])}{built}")
    s.say("  " + ", ".join(shown))
    for key, name in (("cudnn", "cuDNN"), ("cublas", "cuBLAS")):
        loaded, built = v.get(key), v.get(key + "_built")
        if loaded is None or built is None:
            continue
        if loaded // 10000 != built // 10000:  # amp refuses it when the handle is made
            s.causes.append(f"{name} {triple(loaded)} is loaded, another major version than the {triple(built)} amp "
                            f"was built against")
        elif loaded < built:
            s.causes.append(f"{name} {triple(loaded)} is loaded, older than the {triple(built)} amp was built against")
    if "cudnn_cuda" in v and "runtime" in v and v["cudnn_cuda"] // 1000 != v["runtime"] // 1000:  # amp refuses it
        s.causes.append(f"the loaded cuDNN is built for CUDA {cuda_version(v['cudnn_cuda'])}, the runtime is "
                        f"{cuda_version(v['runtime'])}: its run-time compiled engines need the other CUDA's libraries")
    if "driver" in v and "runtime" in v and v["driver"] // 1000 < v["runtime"] // 1000:
        s.causes.append(f"the driver supports CUDA {cuda_version(v['driver'])}, older than the runtime "
                        f"{cuda_version(v['runtime'])} needs")
    # nvidia-smi's line (name, compute capability, driver, memory): CUDA 13's runtime needs driver 580 or newer.
    fields = [f.strip() for f in gpu.splitlines()[0].split(",")] if gpu else []
    driver = fields[2].split(".")[0] if len(fields) > 2 else ""
    if driver.isdigit() and v.get("runtime", 0) >= 13000 and int(driver) < 580:
        s.causes.append(f"the driver {driver} is older than CUDA 13's runtime needs (580)")
    return v


def tests(work, s, status):
    rows = []
    names = [n[5:] for n in status if n.startswith("test-")]
    names += [os.path.basename(p)[5:-4] for p in sorted(glob.glob(os.path.join(work, "test-*.log")))]
    for name in dict.fromkeys(names):
        if not ran(status, f"test-{name}"):
            s.say(f"  {name:<30} {status[f'test-{name}']['status']}")
            continue
        text = read(os.path.join(work, f"test-{name}.log"))
        cases = re.search(r"test cases:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed", text)
        asserts = re.search(r"assertions:\s*(\d+) \|", text)
        skips = len(re.findall(r"^\[amp-skip\]", text, re.M))
        row = {"binary": name, "cases": int(cases.group(1)) if cases else 0,
               "failed": int(cases.group(3)) if cases else None, "skipped": skips,
               "assertions": int(asserts.group(1)) if asserts else 0}
        rows.append(row)
        s.say(f"  {name:<30} {row['cases']:>4} cases {row['assertions']:>7} assertions "
              f"{row['failed'] if cases else '?':>3} failed {skips:>3} skipped")
        if not cases:
            s.fail(f"{name}: no doctest summary (crashed?)")
        elif row["failed"] or skips or not row["assertions"]:
            s.fail(f"{name}: {row['failed']} failed, {skips} skipped, {row['assertions']} assertions")
        for case in re.findall(r"^TEST CASE:\s+(.*)$", text, re.M)[:5]:
            s.say(f"    in: {case[:70]}")
    if not names:
        s.fail("no test log")
    return rows


def sanitizer(work, s, status):
    rows = []
    for log in sorted(glob.glob(os.path.join(work, "sanitizer-*.log"))):
        found = re.search(r"ERROR SUMMARY: (\d+) error", read(log))
        name = os.path.basename(log)[:-4]
        if not ran(status, name):
            s.say(f"  {name}: {status[name]['status']}")
            continue
        rows.append({"run": name, "errors": int(found.group(1)) if found else None})
        s.say(f"  {name}: {found.group(0) if found else 'no ERROR SUMMARY (see its log)'}")
        if not found or found.group(1) != "0":
            s.problems.append(f"{name}: {found.group(0) if found else 'no summary'}")
    return rows


def peers(work, program):
    out = {}
    for line in read(os.path.join(work, f"pytorch_{program}.jsonl")).splitlines():
        try:
            r = json.loads(line)
            out[r["mode"]] = r
        except (ValueError, KeyError):
            pass
    return out


def programs(work, s):
    result = {}
    for program, (metric, tolerance) in PROGRAMS.items():
        eager, graph = (load_json(os.path.join(work, f"{program}.{m}.json")) for m in ("eager", "graph"))
        torch = peers(work, program)
        if not eager or not graph:
            s.fail(f"{program}: no {'eager' if not eager else 'graph'} JSON (see {program}.*.log)")
            continue
        s.say(f"  {program} ({metric}; ms per step eager / graph; PyTorch)")
        s.say(f"  {'level':<8}{'eager':>9}{'graph':>9}{'eager':>8}{'graph':>8}{'x':>6}"
              f"{'launch':>7}{'nodes':>6}  PyTorch")
        by_level = {lv["opt_level"]: lv for lv in graph.get("levels", [])}
        rows = []
        for e in eager.get("levels", []):
            level, g = e["opt_level"], by_level.get(e["opt_level"])
            if g is None:
                s.fail(f"{program} {level}: missing from the --graph run")
                continue
            speedup = e["step_ms"] / g["step_ms"] if g.get("step_ms") else float("nan")
            peer = torch.get(PEER.get(level, ""), {})
            row = {"opt_level": level, "eager": e.get(metric), "graph": g.get(metric), "eager_step_ms": e["step_ms"],
                   "graph_step_ms": g["step_ms"], "speedup": speedup, "launches_per_step": e["launches_per_step"],
                   "graph_nodes": g["graph_nodes"], "pytorch_mode": peer.get("mode"),
                   "pytorch_step_ms": peer.get("step_ms"), "pytorch_metric": peer.get(metric)}
            rows.append(row)
            versus = f"{peer['step_ms']:.3f} {peer['mode'][:4]}" if peer.get("step_ms") else ""
            s.say(f"  {level:<8}{row['eager']:>9.4f}{row['graph']:>9.4f}{row['eager_step_ms']:>8.3f}"
                  f"{row['graph_step_ms']:>8.3f}{speedup:>6.2f}{row['launches_per_step']:>7}{row['graph_nodes']:>6}"
                  f"  {versus}")
            if not (math.isfinite(row["eager"]) and math.isfinite(row["graph"])):
                s.fail(f"{program} {level}: not finite")
            elif abs(row["graph"] - row["eager"]) > tolerance * max(1.0, abs(row["eager"])):
                s.fail(f"{program} {level}: --graph {row['graph']:.4f} against eager {row['eager']:.4f}")
            work_done = {k: (e.get(k), g.get(k)) for k in HOST_WORK if e.get(k) or g.get(k)}
            if work_done:
                s.fail(f"{program} {level}: host work in the loop {work_done}")
            if not g["graph_nodes"]:
                s.fail(f"{program} {level}: --graph recorded no graph")
        result[program] = {"device": graph.get("device"), "levels": rows, "pytorch": torch}
    return result


def fp8_gpt(work, s):
    """bench/fp8_gpt.sh's rows: O2-fp8 against O2-bf16 on a GPT of width 768 and 12 blocks."""
    path = os.path.join(work, "fp8_gpt.csv")
    if not os.path.exists(path):
        s.say("  not run")
        return {}
    with open(path) as f:
        rows = list(csv.DictReader(f))
    by = {r["level"]: r for r in rows}
    for level, r in by.items():
        s.say(f"  {level:8} {float(r['step_ms']):9.2f} ms/step {float(r['tokens_per_second']):12.0f} tokens/s "
              f"val loss {float(r['val_loss']):.4f} ({r['fp8_layers']} FP8 layers)")
    if "O2-bf16" in by and "O2-fp8" in by:
        speedup = float(by["O2-bf16"]["step_ms"]) / float(by["O2-fp8"]["step_ms"])
        s.say(f"  O2-fp8 x{speedup:.2f} the speed of O2-bf16")
        for level in by:
            if not math.isfinite(float(by[level]["val_loss"])):
                s.fail(f"fp8 GPT {level}: validation loss not finite")
        return {"rows": rows, "speedup": speedup}
    s.fail("fp8 GPT: a level is missing from fp8_gpt.csv")
    return {"rows": rows}


def gpt2_small(work, s):
    """bench/gpt2_small.sh's rows: GPT-2 small at context 1024, tokens/s and MFU."""
    path = os.path.join(work, "gpt2_small.csv")
    if not os.path.exists(path):
        s.say("  not run")
        return {}
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        mfu = f"MFU {100 * float(r['mfu']):.1f}%" if r["mfu"] else ""
        s.say(f"  {r['level']:8} context {r['context']:>4} batch {r['batch']:>2} {float(r['tokens_per_second']):10.0f} "
              f"tokens/s ({float(r['tokens_per_second']) / 463000:.2f}x llm.c's H100 figure) {mfu}, "
              f"peak {float(r['total_mib']):.0f} MiB, val loss {float(r['val_loss']):.4f}")
        if not math.isfinite(float(r["val_loss"])):
            s.fail(f"GPT-2 small {r['level']}: validation loss not finite")
    return {"rows": rows}


def row_ops(work, s):
    """bench/row_ops.cpp's rows: the row operations' bandwidth against a copy of as many bytes."""
    data = load_json(os.path.join(work, "row_ops.json"))
    if not data:
        s.say("  not run")
        return {}
    for r in data["rows"]:
        s.say(f"  {r['op']:26} {r['type']:5} {r['shape']:>14} {r['gb_per_s']:8.0f} GB/s  {100 * r['of_copy']:4.0f}% of a copy")
    ln = [r for r in data["rows"] if r["op"] == "layernorm forward" and r["type"] in ("bf16", "fp16")]
    if ln:
        best = max(r["of_copy"] for r in ln)
        s.say(f"  LayerNorm forward, 16-bit: {100 * best:.0f}% of the copy bandwidth (issue 24's target: 70%; printed, "
              "not asserted)")
    return data


def main(work):
    s = Summary()
    gpu = read(os.path.join(work, "gpu.txt")).strip()
    machine = read(os.path.join(work, "machine.txt")).strip()
    s.say("=" * 78)
    s.say(f"amp GPU check: {gpu or 'no GPU reported by nvidia-smi'}" + (f"; {machine}" if machine else ""))
    if machine.startswith("kernel 4.4.0"):
        s.say("  (gVisor: compute-sanitizer and ncu refuse the device there)")
    if not gpu:
        s.problems.append("no GPU")
    s.say("versions loaded:")
    results = {"gpu": gpu, "machine": machine, "versions": versions(work, s, gpu)}
    s.say("stages (the plan, in order):")
    status = results["stages"] = stages(work, s)
    s.say("tests:")
    results["tests"] = tests(work, s, status)
    s.say("compute-sanitizer:")
    said = len(s.lines)
    results["sanitizer"] = sanitizer(work, s, status)
    if len(s.lines) == said:
        s.say("  not run")
    s.say("programs, eager and --graph:")
    results["programs"] = programs(work, s)
    s.say("O2-fp8 against O2-bf16, GPT width 768, 12 blocks (bench/fp8_gpt.sh):")
    results["fp8_gpt"] = fp8_gpt(work, s)
    s.say("GPT-2 small, 124M, O2-bf16 (bench/gpt2_small.sh):")
    results["gpt2_small"] = gpt2_small(work, s)
    s.say("row operations, memory bandwidth (bench/row_ops.cpp):")
    results["row_ops"] = row_ops(work, s)
    if s.causes and not s.problems:  # an old library that nothing tripped over yet
        s.warnings += s.causes
    results.update(problems=s.problems, warnings=s.warnings, likely_causes=s.causes, passed=not s.problems)
    s.say("=" * 78)
    counts = f"{len(s.problems)} problems, " if s.problems else ""
    s.say(f"gpu-check: {'FAILED' if s.problems else 'PASSED'} ({counts}{len(s.warnings)} warnings)")
    if s.problems:
        for cause in s.causes:
            s.say(f"  likely cause: {cause}")
    for why in s.problems[:12]:
        s.say(f"  {why}")
    for why in s.warnings[:8]:
        s.say(f"  warning: {why}")
    text = "\n".join(s.lines) + "\n"
    with open(os.path.join(work, "summary.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    sys.stdout.write(text)
    return 0 if not s.problems else 1


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
