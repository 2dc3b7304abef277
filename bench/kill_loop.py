#!/usr/bin/env python3
"""`record` killed with SIGKILL at random moments, over and over: does any process of its session
(the recorded command, the stop guardian) stay behind? As root:

    sudo python3 bench/kill_loop.py [--build build] [--runs 100] [--seed 1]

Each run records `launch_count 2000 --over 0.5` (stopped at its CUDA library's load while the
probes are placed), kills record after 0..1 s, and waits up to 15 s for its session to empty. A
session that does not is printed with each member's state, comm, syscall and kernel stack, the
stop maps' contents and how many links and stopping programs the kernel still has; then its members
are continued."""
import argparse
import os
import random
import signal
import subprocess
import tempfile
import time


def members(sid):
    out = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                s = f.read()
            rest = s[s.rindex(")") + 2:].split()
            if int(rest[3]) == sid:
                out[int(e)] = rest[0]
        except (OSError, ValueError):
            pass
    return out


def show(pid):
    for name in ("comm", "status", "syscall", "stack"):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                text = f.read().strip().replace("\n", " | ")
        except OSError as e:
            text = str(e)
        print(f"  {pid} {name}: {text[:600]}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = os.path.join(tempfile.mkdtemp(), "r.gpuscope")
    stuck = 0
    for i in range(a.runs):
        rec = subprocess.Popen([f"{a.build}/gpuscope", "record", "-o", out, "--", f"{a.build}/targets/launch_count",
                                "2000", "--over", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        delay = rng.uniform(0, 1.0)
        time.sleep(delay)
        rec.kill()
        rec.wait()
        until = time.monotonic() + 15
        while members(rec.pid) and time.monotonic() < until:
            time.sleep(0.05)
        left = members(rec.pid)
        if not left:
            continue
        stuck += 1
        print(f"run {i}, killed after {delay:.3f} s: left {left}", flush=True)
        for p in left:
            show(p)
        os.system("for id in $(bpftool map show | awk '/stops_made|stops_answered/{print $1}' | tr -d :); do "
                  "echo map $id; bpftool map dump id $id; done; "
                  "echo links: $(bpftool link show | grep -c .); echo stopping programs: $(bpftool prog show | grep -c on_close)")
        for p in left:
            os.kill(p, signal.SIGCONT)
        time.sleep(2)
    print(f"{a.runs} kills, {stuck} sessions left behind")


if __name__ == "__main__":
    main()
