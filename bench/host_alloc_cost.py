#!/usr/bin/env python3
"""What recording host allocations (bpf/host_allocs.bpf.c, `record --host-allocs`) adds to a
program's mmap and munmap.

    sudo python3 bench/host_alloc_cost.py [--build build] [--rounds 20000] [--repeats 5]

Runs build/bench/mmap_loop (map 1 MiB, touch a page, unmap, in a loop) alone, under `gpuscope
record --host-allocs 0` and under `gpuscope record` (256 KiB: every round's mapping recorded, the
first 200 a second with a copy of its stack, the rest without), and a mapping of 64 KiB, under the
threshold, under `gpuscope record` (the programs' cheap path). Interleaved, REPEATS times; prints
the median ns a round of each and what each adds."""
import argparse
import re
import statistics
import subprocess


def loop(build, rounds, nbytes, record=None):
    cmd = [f"{build}/bench/mmap_loop", str(rounds), str(nbytes)]
    if record is not None:
        cmd = [f"{build}/gpuscope", "record", "-q", "-o", "/tmp/host_alloc_cost.gpuscope"] + record + ["--"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([0-9.]+) ns a round", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    runs = {
        "1 MiB alone": (1 << 20, None),
        "1 MiB, record --host-allocs 0": (1 << 20, ["--host-allocs", "0"]),
        "1 MiB, record (recorded)": (1 << 20, []),
        "64 KiB alone": (64 << 10, None),
        "64 KiB, record (under 256 KiB)": (64 << 10, []),
    }
    results = {k: [] for k in runs}
    for _ in range(a.repeats):
        for name, (nbytes, record) in runs.items():
            results[name].append(loop(a.build, a.rounds, nbytes, record))
    print(f"mmap_loop, {a.rounds} rounds, {a.repeats} repeats interleaved; ns a round (median, range)")
    for name, v in results.items():
        base = statistics.median(results["64 KiB alone" if name.startswith("64") else "1 MiB alone"])
        m = statistics.median(v)
        print(f"  {name:32} {m:8.0f}  ({min(v):.0f}..{max(v):.0f})  added {m - base:+6.0f}")


if __name__ == "__main__":
    main()
