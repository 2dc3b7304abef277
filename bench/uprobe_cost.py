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


STREAMS = 1


def run_loop(build, calls, threads, mode, wrapper=(), record_file=None):
    cmd = [str(build / "bench" / "launch_loop"), "--calls", str(calls), "--threads", str(threads), "--mode", mode,
           "--streams", str(STREAMS)]
    if record_file:
        cmd = [str(build / "gpuscope"), "record", "-q", *wrapper, "-o", str(record_file), "--"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def lost_and_calls(record_file):
    with sqlite3.connect(record_file) as db:
        lost = db.execute("SELECT coalesce(sum(count), 0) FROM lost").fetchone()[0]
        calls = db.execute("SELECT count(*) FROM calls WHERE func != 60").fetchone()[0]
    return lost, calls


def own_cost(record_file):
    """gpuscope's own CPU seconds, recording seconds and peak RSS (MiB), from the record."""
    with sqlite3.connect(record_file) as db:
        meta = dict(db.execute("SELECT key, value FROM meta"))
    secs = (int(meta["end_ns"]) - int(meta["start_ns"])) / 1e9
    return int(meta.get("recorder_cpu_ns", 0)) / 1e9, secs, int(meta.get("recorder_max_rss_kb", 0)) / 1024


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
    ap.add_argument("--streams", type=int, default=1, help="real mode: launch round-robin over this many streams")
    ap.add_argument("--json")
    args = ap.parse_args()
    global STREAMS
    STREAMS = args.streams
    build = pathlib.Path(args.build)
    lib = cudart_of(build / "bench" / "launch_loop")
    symbol = {"invalid": ["cudaLaunchKernel"], "real": ["cudaLaunchKernel"], "free-null": ["cudaFree"]}[args.mode]
    floors = {"empty BPF program": {lib: symbol}}
    # A real launch reaches the driver, where gpuscope records it with one probe (the runtime's
    # launch probes leave once the driver is probed): the floor is one trap there. Two traps
    # (runtime and driver) is what recording both levels costs, for comparison.
    if args.mode == "real" and driver_library():
        drv = {driver_library(): ["cuLaunchKernel", "cuLaunchKernel_ptsz"]}
        floors = {"empty BPF program": drv, "empty BPF program x2": {lib: symbol, **drv}}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gpuscope-bench-"))

    configs = ["baseline", *floors, "gpuscope --no-stacks", "gpuscope (stacks)"]
    if len(floors) > 1:
        configs.append("gpuscope (stacks) --launch-probes both")
    ns = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            if c == "baseline":
                res = run_loop(build, args.calls, 1, args.mode)
            elif c in floors:
                probe = EmptyProbe(build, floors[c])
                try:
                    res = run_loop(build, args.calls, 1, args.mode)
                finally:
                    probe.close()
            else:
                wrapper = ["--no-stacks"] if "no-stacks" in c else []
                wrapper += ["--launch-probes", "both"] if "both" in c else []
                rec = tmp / f"r{r}.gpuscope"
                res = run_loop(build, args.calls, 1, args.mode, wrapper, rec)
                lost, calls = lost_and_calls(rec)
                if lost or calls < args.calls:
                    print(f"warning: {c} round {r}: {lost} lost, {calls} of {args.calls} calls recorded")
                rec.unlink()
            ns[c].append(res["ns_per_call"])
    base = statistics.median(ns["baseline"])
    floor = statistics.median(ns["empty BPF program"]) - base  # one trap
    result = {"mode": args.mode, "streams": args.streams, "calls": args.calls, "rounds": args.rounds, "configs": {}}
    print(f"\nper-call cost, {args.mode} cudaLaunchKernel loop, {args.streams} stream(s), {args.calls} calls x "
          f"{args.rounds} rounds (median, min..max)")
    print(f"{'configuration':24} {'ns/call':>10} {'spread':>18} {'added ns':>10} {'x floor':>8}")
    for c in configs:
        med = statistics.median(ns[c])
        added = med - base
        ratio = added / floor if c != "baseline" and floor > 0 else None
        result["configs"][c] = {"ns_per_call": ns[c], "median": med, "added_ns": added, "ratio_to_floor": ratio}
        print(f"{c:24} {med:10.0f} {min(ns[c]):8.0f}..{max(ns[c]):<8.0f} {added:10.0f} "
              f"{'' if ratio is None else f'{ratio:8.2f}'}")

    print("\nevent rate under gpuscope (stacks on), all threads together")
    print("(CPU: gpuscope's own, as % of one core over the recording, and per 100k events/s)")
    print(f"{'threads':>8} {'events/s':>12} {'recorded':>10} {'lost':>6} {'CPU %':>7} {'%/100k ev/s':>12} {'RSS MiB':>8}")
    result["rate"] = []
    for t in [int(x) for x in args.rate_threads.split(",") if x]:
        rec = tmp / f"rate{t}.gpuscope"
        res = run_loop(build, args.rate_calls // t, t, args.mode, [], rec)
        lost, calls = lost_and_calls(rec)
        cpu_s, secs, rss = own_cost(rec)
        cpu_pct = 100 * cpu_s / secs if secs else 0
        per_100k = cpu_pct / (res["calls_per_second"] / 1e5) if res["calls_per_second"] else 0
        result["rate"].append({"threads": t, "calls_per_second": res["calls_per_second"], "recorded": calls,
                               "expected": res["calls"], "lost": lost, "recorder_cpu_s": cpu_s,
                               "recording_s": secs, "recorder_max_rss_mb": rss})
        print(f"{t:8d} {res['calls_per_second']:12.0f} {calls:10d} {lost:6d} {cpu_pct:7.1f} {per_100k:12.2f} {rss:8.0f}")
        lost_by, funcs = breakdown(rec)
        if lost_by:
            print(f"{'':8} lost by cause {lost_by}; calls recorded {funcs}")
        rec.unlink()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
