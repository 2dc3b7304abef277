#!/usr/bin/env python3
"""What the heap hooks of libgpuscope_launches.so (src/inject/heap_hooks.cpp) add to a program's
allocations.

    sudo python3 bench/heap_hooks_cost.py [--build build] [--repeats 5]

Runs build/bench/malloc_loop (malloc, touch a byte, free) for blocks of 64 B and 64 KiB (under
the 256 KiB from which blocks are handed over: the path nearly every allocation takes) and of
1 MiB (each handed over to a probe, with its stack, and its freeing: 1,000 rounds, within the
hooks' burst), each alone, with the library preloaded and not asked to hand anything over, and
under `gpuscope record` (hooks on). Interleaved, REPEATS times; prints the median ns a round of
each and what it adds."""
import argparse
import os
import re
import statistics
import subprocess


def loop(build, rounds, nbytes, how):
    cmd = [f"{build}/bench/malloc_loop", str(rounds), str(nbytes)]
    env = dict(os.environ)
    env.pop("GPUSCOPE_HEAP_ALLOC_MIN", None)
    if how == "preloaded":
        env["LD_PRELOAD"] = f"{build}/libgpuscope_launches.so"
    elif how == "recorded":
        cmd = [f"{build}/gpuscope", "record", "-q", "-o", "/tmp/heap_hooks_cost.gpuscope", "--"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return float(re.search(r"([0-9.]+) ns a round", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    sizes = [(64, 2_000_000), (64 << 10, 2_000_000), (1 << 20, 1000)]
    hows = ("alone", "preloaded", "recorded")
    results = {(n, h): [] for n, _ in sizes for h in hows}
    for _ in range(a.repeats):
        for n, rounds in sizes:
            for h in hows:
                results[(n, h)].append(loop(a.build, rounds, n, h))
    print(f"malloc_loop, {a.repeats} repeats interleaved; ns a round (median, range)")
    for n, rounds in sizes:
        base = statistics.median(results[(n, "alone")])
        for h in hows:
            v = results[(n, h)]
            m = statistics.median(v)
            print(f"  {n:>8} B x {rounds:>9}, {h:10} {m:9.1f}  ({min(v):.1f}..{max(v):.1f})  added {m - base:+8.1f}")


if __name__ == "__main__":
    main()
