#!/usr/bin/env python3
"""What probing NCCL adds to a call of its API (issue 34's aim: at most one trap a collective).

    sudo python3 bench/nccl_call_cost.py [--build build] [--calls 100000] [--repeats 5]

Runs build/bench/nccl_loop, without a GPU: ncclAllReduce on a null communicator (NCCL refuses it at
once; a collective, probed at entry only) and ncclCommDestroy(NULL) (returns at once; probed at
entry and return), each alone, under `gpuscope record --no-stacks` (the probes alone) and under
`gpuscope record` (each call's stack too: NCCL's calls are not sampled), interleaved REPEATS
times. Prints the median ns a call of each and what recording adds: without stacks a collective
should add one trap, the destroy two."""
import argparse
import re
import statistics
import subprocess


def loop(build, calls, which, record):
    cmd = [f"{build}/bench/nccl_loop", str(calls), which]
    if record:
        stacks = [] if record == "recorded" else ["--no-stacks"]
        cmd = [f"{build}/gpuscope", "record", "-q", "-o", "/tmp/nccl_call_cost.gpuscope", *stacks, "--"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([0-9.]+) ns a call", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    modes = (None, "recorded, no stacks", "recorded")
    runs = [(which, record) for which in ("allreduce", "destroy") for record in modes]
    results = {r: [] for r in runs}
    for _ in range(a.repeats):
        for which, record in runs:
            results[(which, record)].append(loop(a.build, a.calls, which, record))
    print(f"nccl_loop, {a.calls} calls, {a.repeats} repeats interleaved; ns a call (median, range)")
    labels = {"allreduce": "ncclAllReduce (entry probe)", "destroy": "ncclCommDestroy(NULL) (entry + return)"}
    for which in ("allreduce", "destroy"):
        base = statistics.median(results[(which, None)])
        for record in modes:
            v = results[(which, record)]
            m = statistics.median(v)
            name = f"{labels[which]}, {record or 'alone'}"
            print(f"  {name:50} {m:8.0f}  ({min(v):.0f}..{max(v):.0f})  added {m - base:+6.0f}")


if __name__ == "__main__":
    main()
