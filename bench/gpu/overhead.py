#!/usr/bin/env python3
"""Overhead of gpuscope against a baseline and against torch.profiler, on the workloads of
workloads.py, configurations interleaved round by round (issue 3's suite; partial).

    BUILD=build-static python3 bench/gpu/overhead.py [--rounds 5] [--workloads a,b] [--out DIR]
Prints a table (median and min..max per configuration, ratio to baseline, and gpuscope's added
time against torch.profiler's) and writes overhead.json and overhead.png to --out."""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONFIGS = ["baseline", "gpuscope --no-stacks", "gpuscope", "torch.profiler", "torch.profiler+stack"]


def run(workload, config, build, tmp):
    cmd = [sys.executable, str(HERE / "workloads.py"), workload]
    if config.startswith("torch.profiler"):
        cmd += ["--profiler", "cuda+stack" if config.endswith("+stack") else "cuda"]
    if config.startswith("gpuscope"):
        extra = ["--no-stacks"] if "no-stacks" in config else []
        cmd = [str(build / "gpuscope"), "record", "-q", *extra, "-o", str(tmp / "o.gpuscope"), "--"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default="eager_add,train_step,generation,copy_mix")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    build = pathlib.Path(os.environ.get("BUILD", ROOT / "build"))
    tmp = pathlib.Path(tempfile.mkdtemp())
    results = {}
    for w in args.workloads.split(","):
        samples = {c: [] for c in CONFIGS}
        unit = ""
        for _ in range(args.rounds):
            for c in CONFIGS:
                r = run(w, c, build, tmp)
                samples[c].append(r["per_step"])
                unit = r["unit"]
        base = statistics.median(samples["baseline"])
        results[w] = {"unit": unit, "configs": {}}
        print(f"\n{w} ({unit}), {args.rounds} interleaved rounds")
        print(f"  {'configuration':22} {'median':>10} {'min..max':>20} {'x baseline':>11} {'added':>9}")
        for c in CONFIGS:
            med = statistics.median(samples[c])
            results[w]["configs"][c] = {"samples": samples[c], "median": med, "ratio": med / base, "added": med - base}
            print(f"  {c:22} {med:10.3f} {min(samples[c]):9.3f}..{max(samples[c]):<9.3f} {med / base:11.3f} "
                  f"{med - base:9.3f}")
        ours = results[w]["configs"]["gpuscope"]["added"]
        theirs = results[w]["configs"]["torch.profiler+stack"]["added"]
        if ours > 0:
            print(f"  torch.profiler+stack adds {theirs / ours:.1f}x what gpuscope (stacks) adds")
        else:
            print("  gpuscope (stacks) added no measurable time")
    out = pathlib.Path(args.out)
    (out / "overhead.json").write_text(json.dumps(results, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.5))
        for ax, (w, r) in zip(axes if len(results) > 1 else [axes], results.items()):
            ratios = [r["configs"][c]["ratio"] for c in CONFIGS]
            ax.bar(range(len(CONFIGS)), ratios, color=["grey", "tab:blue", "tab:blue", "tab:orange", "tab:orange"])
            ax.set_xticks(range(len(CONFIGS)), [c.replace(" ", "\n") for c in CONFIGS], fontsize=7)
            ax.set_title(f"{w}", fontsize=9)
            ax.set_ylabel("time / baseline")
            ax.axhline(1.0, color="black", linewidth=0.5)
        fig.tight_layout()
        fig.savefig(out / "overhead.png", dpi=110)
    except ImportError:
        print("matplotlib not available: no chart")


if __name__ == "__main__":
    main()
