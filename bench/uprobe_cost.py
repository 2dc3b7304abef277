#!/usr/bin/env python3
"""CPU time added per probed CUDA call, against the floor (an empty BPF program on the same
function), and the event rate gpuscope sustains with zero lost events.

    sudo bench/uprobe_cost.py [--build build] [--calls 200000] [--rounds 5] [--mode invalid|real]

Configurations are interleaved round by round so that machine noise hits them alike; medians
and the spread (min..max) are printed, and the whole result as JSON (--json FILE)."""
import argparse
import json
import os
import pathlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_loop(build, calls, threads, mode, wrapper=(), record_file=None):
    cmd = [str(build / "bench" / "launch_loop"), "--calls", str(calls), "--threads", str(threads), "--mode", mode]
    if record_file:
        cmd = [str(build / "gpuscope"), "record", "-q", *wrapper, "-o", str(record_file), "--"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def lost_and_calls(record_file):
    with sqlite3.connect(record_file) as db:
        lost = db.execute("SELECT coalesce(sum(count), 0) FROM lost").fetchone()[0]
        calls = db.execute("SELECT count(*) FROM calls WHERE func != 60").fetchone()[0]
    return lost, calls


def breakdown(record_file):
    """Lost events by cause and recorded calls by function, to explain a rate."""
    with sqlite3.connect(record_file) as db:
        lost = dict(db.execute("SELECT cause, count FROM lost WHERE count > 0"))
        funcs = dict(db.execute("SELECT f.name, count(*) FROM calls c JOIN functions f ON f.id = c.func "
                                "GROUP BY f.name ORDER BY 2 DESC LIMIT 5"))
    return lost, funcs


class EmptyProbe:
    """The floor: an empty program on the same functions gpuscope probes, attached for the
    duration ({library: [symbols]})."""

    def __init__(self, build, targets):
        self.procs = []
        for lib, symbols in targets.items():
            proc = subprocess.Popen([str(build / "bench" / "empty_probe"), lib, *symbols],
                                    stderr=subprocess.PIPE, text=True)
            line = proc.stderr.readline()
            self.procs.append(proc)
            if "attached" not in line:
                self.close()
                raise RuntimeError(f"empty_probe failed: {line}")

    def close(self):
        for p in self.procs:
            p.terminate()
            p.wait()


def driver_library():
    """The path of libcuda.so.1 as the dynamic loader finds it, or None without a driver."""
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for line in open("/proc/self/maps"):
        if "libcuda.so" in line:
            return line.split()[-1]
    return None


def cudart_of(binary):
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "libcudart.so" in line and "=>" in line:
            return line.split("=>")[1].split()[0]
    raise RuntimeError("launch_loop is not linked to a shared libcudart")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", default="invalid")
    ap.add_argument("--rate-threads", default="1,2,4,8,16")
    ap.add_argument("--rate-calls", type=int, default=500000)
    ap.add_argument("--json")
    args = ap.parse_args()
    build = pathlib.Path(args.build)
    lib = cudart_of(build / "bench" / "launch_loop")
    symbol = {"invalid": ["cudaLaunchKernel"], "real": ["cudaLaunchKernel"], "free-null": ["cudaFree"]}[args.mode]
    floor_targets = {lib: symbol}
    # A real launch also traps in the driver, where gpuscope probes too: the floor has both.
    if args.mode == "real" and driver_library():
        floor_targets[driver_library()] = ["cuLaunchKernel", "cuLaunchKernel_ptsz"]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gpuscope-bench-"))

    configs = ["baseline", "empty BPF program", "gpuscope --no-stacks", "gpuscope (stacks)"]
    ns = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            if c == "baseline":
                res = run_loop(build, args.calls, 1, args.mode)
            elif c == "empty BPF program":
                probe = EmptyProbe(build, floor_targets)
                try:
                    res = run_loop(build, args.calls, 1, args.mode)
                finally:
                    probe.close()
            else:
                wrapper = ["--no-stacks"] if "no-stacks" in c else []
                rec = tmp / f"r{r}.gpuscope"
                res = run_loop(build, args.calls, 1, args.mode, wrapper, rec)
                lost, calls = lost_and_calls(rec)
                if lost or calls < args.calls:
                    print(f"warning: {c} round {r}: {lost} lost, {calls} of {args.calls} calls recorded")
                rec.unlink()
            ns[c].append(res["ns_per_call"])
    base = statistics.median(ns["baseline"])
    floor = statistics.median(ns["empty BPF program"]) - base
    result = {"mode": args.mode, "calls": args.calls, "rounds": args.rounds, "configs": {}}
    print(f"\nper-call cost, {args.mode} cudaLaunchKernel loop, {args.calls} calls x {args.rounds} rounds (median, min..max)")
    print(f"{'configuration':24} {'ns/call':>10} {'spread':>18} {'added ns':>10} {'x floor':>8}")
    for c in configs:
        med = statistics.median(ns[c])
        added = med - base
        ratio = added / floor if c != "baseline" and floor > 0 else None
        result["configs"][c] = {"ns_per_call": ns[c], "median": med, "added_ns": added, "ratio_to_floor": ratio}
        print(f"{c:24} {med:10.0f} {min(ns[c]):8.0f}..{max(ns[c]):<8.0f} {added:10.0f} "
              f"{'' if ratio is None else f'{ratio:8.2f}'}")

    print("\nevent rate under gpuscope (stacks on), all threads together")
    print(f"{'threads':>8} {'events/s':>12} {'recorded':>10} {'lost':>6}")
    result["rate"] = []
    for t in map(int, args.rate_threads.split(",")):
        rec = tmp / f"rate{t}.gpuscope"
        res = run_loop(build, args.rate_calls // t, t, args.mode, [], rec)
        lost, calls = lost_and_calls(rec)
        result["rate"].append({"threads": t, "calls_per_second": res["calls_per_second"], "recorded": calls,
                               "expected": res["calls"], "lost": lost})
        print(f"{t:8d} {res['calls_per_second']:12.0f} {calls:10d} {lost:6d}")
        lost_by, funcs = breakdown(rec)
        if lost_by:
            print(f"{'':8} lost by cause {lost_by}; calls recorded {funcs}")
        rec.unlink()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
