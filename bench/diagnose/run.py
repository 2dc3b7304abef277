#!/usr/bin/env python3
"""Injects one fault at a time into bench/diagnose/workload.py under `gpuscope record`, runs
`gpuscope diagnose --json` on each record and scores its top finding against the fault injected.

    sudo python3 bench/diagnose/run.py [--build build-static] [--out DIR] [--steps 300] [--scenarios a,b]
Scenarios (expected cause): clean (none), hog (cpu_contention: two spinning processes on the
workload's CPU, all pinned to CPU 0), sleep (sleep), pageable (pageable_copies), fsync (io_wait),
worker (input_wait).
Prints, per scenario, the step time, the top finding and its share, and the top-1 score."""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = {
    "clean": ("none", "none", False),
    "hog": ("none", "cpu_contention", True),
    "sleep": ("sleep", "sleep", False),
    "pageable": ("pageable", "pageable_copies", False),
    "fsync": ("fsync", "io_wait", False),
    "worker": ("worker", "input_wait", False),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/diagnose-out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    hits = 0
    names = a.scenarios.split(",")
    for name in names:
        fault, expected, hog = SCENARIOS[name]
        rec = os.path.join(a.out, f"{name}.gpuscope")
        cmd = [a.python, os.path.join(HERE, "workload.py"), "--fault", fault, "--steps", str(a.steps), "--dir", a.out]
        hogs = []
        if hog:
            cmd = ["taskset", "-c", "0"] + cmd
            hogs = [subprocess.Popen(["taskset", "-c", "0", a.python, "-c", "while True: pass"]) for _ in range(2)]
            time.sleep(0.3)
        t0 = time.time()
        r = subprocess.run([f"{a.build}/gpuscope", "record", "-q", "-o", rec, "--"] + cmd, capture_output=True, text=True)
        for h in hogs:
            h.kill()
            h.wait()
        wall = time.time() - t0
        d = subprocess.run([f"{a.build}/gpuscope", "diagnose", "--json", rec], capture_output=True, text=True)
        if r.returncode or d.returncode:
            print(f"{name:9} FAILED: record rc {r.returncode} {r.stderr[-300:]} diagnose rc {d.returncode} {d.stderr[-300:]}")
            continue
        open(os.path.join(a.out, f"{name}.json"), "w").write(d.stdout)
        doc = json.loads(d.stdout)
        proc = doc["processes"][0] if doc["processes"] else None
        top = proc["findings"][0] if proc else {"cause": "?", "share_of_step": 0}
        ok = top["cause"] == expected
        hits += ok
        steps = proc["steps"] if proc else {}
        print(f"{name:9} {'HIT ' if ok else 'MISS'} expected {expected:16} top {top['cause']:16} "
              f"{top.get('share_of_step', 0) * 100:5.1f}% of a step; steps {steps.get('count')} p50 "
              f"{steps.get('p50_ms', 0):.2f} ms; {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}; "
              f"{wall:.1f} s")
        for f in (proc or {}).get("findings", [])[1:3]:
            print(f"{'':14} then {f['cause']} {f['share_of_step'] * 100:.1f}%")
    print(f"top-1: {hits} of {len(names)}")


if __name__ == "__main__":
    main()
