#!/usr/bin/env python3
"""What host telemetry's scheduler programs (bpf/host.bpf.c) add to a context switch.

    sudo python3 bench/host_telemetry_cost.py [--build build] [--rounds 200000] [--repeats 5]

Runs build/bench/sched_pingpong (two processes on one CPU passing a byte through pipes: every pass
a context switch) alone, beside `gpuscope record` of another program with and without host
telemetry (the ping-pong's tasks are not targets: each switch costs the untracked path), and under
`gpuscope record` itself (its two processes are targets: the whole accounting path). Interleaved,
REPEATS times; prints the median ns a switch of each and what each adds."""
import argparse
import re
import statistics
import subprocess
import time


def pingpong(build, rounds, under=None):
    cmd = [f"{build}/bench/sched_pingpong", str(rounds), "0"]
    if under == "tracked":
        out = subprocess.run([f"{build}/gpuscope", "record", "-q", "-o", "/tmp/host_cost.gpuscope", "--"] + cmd,
                             capture_output=True, text=True, check=True).stdout
    else:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([0-9.]+) ns a switch", out).group(1))


def beside(build, extra):
    """gpuscope recording a sleeping program, started and ready."""
    p = subprocess.Popen([f"{build}/gpuscope", "record", "-q", "-o", "/tmp/host_cost_beside.gpuscope"] + extra +
                         ["--", "sleep", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(2.0)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=200000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    results = {k: [] for k in ("alone", "beside, no host telemetry", "beside, host telemetry", "traced")}
    for _ in range(a.repeats):
        results["alone"].append(pingpong(a.build, a.rounds))
        for name, extra in (("beside, no host telemetry", ["--no-host-telemetry"]), ("beside, host telemetry", [])):
            p = beside(a.build, extra)
            try:
                results[name].append(pingpong(a.build, a.rounds))
            finally:
                p.terminate()
                p.wait()
        results["traced"].append(pingpong(a.build, a.rounds, under="tracked"))
    base = statistics.median(results["alone"])
    print(f"sched_pingpong, {a.rounds} rounds, {a.repeats} repeats interleaved; ns a context switch (median, range)")
    for name, v in results.items():
        m = statistics.median(v)
        print(f"  {name:28} {m:8.0f}  ({min(v):.0f}..{max(v):.0f})  added {m - base:+6.0f}")


if __name__ == "__main__":
    main()
