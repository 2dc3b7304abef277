#!/usr/bin/env python3
"""The agent's own CPU beside bench/agent_python_standin.py, for one or more gpuscope binaries
in interleaved rounds: the agent at its defaults with 100 Hz CPU sampling, nothing asking for its
profiles (as a node with only Prometheus scraping it), measured over --seconds after --settle.
Needs root and libcudart; no GPU.

    sudo bench/agent_cpu_ab.py --gpuscope OLD --gpuscope NEW [--rounds 2] [--seconds 60] [--settle 15]

Prints each run's share of a core, by thread, and each binary's median."""
import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "diagnose"))
from run import cpu_seconds, thread_cpu, thread_split  # noqa: E402


def one(binary, seconds, settle, port):
    with tempfile.TemporaryDirectory() as d:
        config = pathlib.Path(d) / "agent.yaml"
        config.write_text(f"listen: 127.0.0.1:{port}\ncpu_profile_hz: 100\n")
        log = open(pathlib.Path(d) / "agent.log", "w+")
        agent = subprocess.Popen([binary, "agent", "--config", config], stderr=log)
        try:
            while "serving /metrics" not in pathlib.Path(log.name).read_text():
                if agent.poll() is not None:
                    raise SystemExit(f"{binary} agent exited: {pathlib.Path(log.name).read_text()}")
                time.sleep(0.1)
            job = subprocess.Popen([sys.executable, ROOT / "bench" / "agent_python_standin.py", str(settle + seconds + 5)],
                                   stdout=subprocess.DEVNULL)
            time.sleep(settle)
            cpu0, threads0, t0 = cpu_seconds(agent.pid), thread_cpu(agent.pid), time.monotonic()
            time.sleep(seconds)
            share = (cpu_seconds(agent.pid) - cpu0) / (time.monotonic() - t0) * 100
            split = thread_split(threads0, thread_cpu(agent.pid), time.monotonic() - t0)
            job.wait()
            return share, split
        finally:
            agent.terminate()
            agent.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--settle", type=float, default=15)
    ap.add_argument("--port", type=int, default=19478)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the agent needs root: run this with sudo")
    shares = {b: [] for b in a.gpuscope}
    for r in range(a.rounds):
        for b in a.gpuscope:
            share, split = one(b, a.seconds, a.settle, a.port)
            shares[b].append(share)
            print(f"round {r + 1} {b}: {share:.2f}% of a core ({split})", flush=True)
    for b, s in shares.items():
        print(f"{b}: median {statistics.median(s):.2f}% of a core over {len(s)} rounds ({', '.join(f'{x:.2f}' for x in s)})")


if __name__ == "__main__":
    main()
