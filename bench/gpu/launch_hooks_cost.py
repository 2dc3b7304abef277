#!/usr/bin/env python3
"""What a launch costs the program with each way gpuscope collects launches (issue 33), on the
GPU machine: bench/launch_loop's C++ loop of empty kernels on several streams (bound by the CPU
side of a launch), interleaved round by round:

  baseline            the loop alone
  hooks only          libgpuscope_launches.so preloaded, its rings drained (build/bench/launch_ring_drain)
  probes, no stacks   record --no-stacks (one trap a launch)
  in-process          record --launch-probes in-process --no-stacks
  in-process budget   record --launch-probes in-process (1 launch in N through a probe, for its stack)
  probes budget       record (the default: one trap a launch, stacks within the budget)

    python3 bench/gpu/launch_hooks_cost.py --build build-static [--rounds 5] [--calls 200000] [--streams 4]
Prints each configuration's ns per launch (median and spread over the rounds) and what it adds."""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--streams", type=int, default=4)
    a = ap.parse_args()
    build = (ROOT / a.build).resolve()
    loop = [str(build / "bench" / "launch_loop"), "--mode", "real", "--streams", str(a.streams),
            "--calls", str(a.calls)]
    gs = str(build / "gpuscope")
    configs = {
        "baseline": loop,
        "hooks only": [str(build / "bench" / "launch_ring_drain"), "--lib", str(build / "libgpuscope_launches.so"),
                       "--", *loop],
        "probes, no stacks": [gs, "record", "-q", "--no-stacks", "-o", "{out}", "--", *loop],
        "in-process": [gs, "record", "-q", "--launch-probes", "in-process", "--no-stacks", "-o", "{out}", "--", *loop],
        "in-process budget": [gs, "record", "-q", "--launch-probes", "in-process", "-o", "{out}", "--", *loop],
        "probes budget": [gs, "record", "-q", "-o", "{out}", "--", *loop],
    }
    results = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.gpuscope")
        for r in range(a.rounds):
            for name, cmd in configs.items():
                p = subprocess.run([c.replace("{out}", out) for c in cmd], capture_output=True, text=True)
                lines = [l for l in p.stdout.splitlines() if l.startswith("{\"mode\"")]
                if p.returncode != 0 or not lines:
                    print(f"round {r + 1} {name}: failed ({p.returncode}): {p.stderr.strip()[-300:]}")
                    continue
                ns = json.loads(lines[-1])["ns_per_call"]
                results[name].append(ns)
                print(f"round {r + 1} {name}: {ns:.1f} ns a launch", flush=True)
    base = statistics.median(results["baseline"]) if results["baseline"] else float("nan")
    print(f"\n{'configuration':20} {'ns/launch':>10} {'spread':>18} {'added':>9}")
    for name, v in results.items():
        if not v:
            continue
        m = statistics.median(v)
        print(f"{name:20} {m:10.1f} {min(v):8.1f}..{max(v):<8.1f} {m - base:+9.1f}")


if __name__ == "__main__":
    main()
