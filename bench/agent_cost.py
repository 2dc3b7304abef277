#!/usr/bin/env python3
"""What `gpuscope agent` costs, and whether its overhead budget holds.

    sudo bench/agent_cost.py [--build build] [--seconds 20] [--rates 0,10000,100000] [--mode invalid|real]
    sudo bench/agent_cost.py --budget-check [--workload "python3 bench/gpu/workloads.py eager_add ..."]

Part 1 (always): the agent's CPU (share of one core) and resident memory while idle and while
bench/launch_loop makes probed calls at fixed rates, with the budget off (budget 1: every event
is traced, so the rate is what the agent handles) and on (the default 1%). Events per second are
read from the agent's own gpuscope_agent_events_total.

Part 2 (--budget-check): a launch-bound PyTorch job (bench/gpu/launch_bound.py: µs per op over
a minute) run alone and under the agent, interleaved round by round; prints its slowdown, the agent's observed_ratio and estimated overhead for it,
and the agent's CPU and RSS. The budget holds when the slowdown is about the budget or less.
Prints one JSON line per measurement and a table."""
import argparse
import json
import os
import pathlib
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
DEFAULT_BUDGET = 0.01  # the agent's own default (src/agent/config.h)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def rss_mib(pid, field="VmRSS"):
    """Resident memory now (VmRSS), or at its peak (field="VmHWM")."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def metrics(url):
    out = {}
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$', line)
        if m and not line.startswith("#"):
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def total(m, name, contains=""):
    return sum(v for labels, v in m.get(name, []) if contains in labels)


class Agent:
    def __init__(self, build, budget, extra=""):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = tempfile.TemporaryDirectory()
        cfg = pathlib.Path(self.dir.name) / "agent.yaml"
        cfg.write_text(f"listen: 127.0.0.1:{self.port}\nbudget: {budget}\n{extra}")
        self.log = open(pathlib.Path(self.dir.name) / "agent.log", "w+")
        self.proc = subprocess.Popen([str(build / "gpuscope"), "agent", "--config", str(cfg)], stderr=self.log)
        deadline = time.time() + 60
        while True:
            try:
                metrics(self.url)
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.log.seek(0)
                    sys.exit(f"agent did not start: {self.log.read()}")
                time.sleep(0.1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # Where each thread waits, for the record, then the hard way out.
            print(f"agent did not stop within 60 s after SIGTERM; its threads:", flush=True)
            for task in sorted(pathlib.Path(f"/proc/{self.proc.pid}/task").iterdir()):
                def read(name):
                    try:
                        return (task / name).read_text().strip()
                    except OSError as e:
                        return f"({e})"
                print(f"  {task.name} {read('comm')} wchan={read('wchan')} state={read('stat').split()[2]}")
                print("    " + read("stack").replace("\n", "\n    "))
            self.proc.kill()
            self.proc.wait()
        self.log.seek(0)
        return self.log.read()


def measure_rate(build, agent, rate, seconds, mode):
    """The agent's CPU share and RSS while launch_loop calls at `rate` per second."""
    m0 = metrics(agent.url)
    c0, t0 = cpu_s(agent.proc.pid), time.time()
    load = None
    if rate:
        load = subprocess.Popen([str(build / "bench" / "launch_loop"), "--mode", mode, "--rate", str(rate),
                                 "--calls", str(int(rate * seconds))], stdout=subprocess.PIPE, text=True)
    peak = rss_mib(agent.proc.pid)
    end = t0 + seconds
    while time.time() < end or (load and load.poll() is None):
        time.sleep(0.25)
        peak = max(peak, rss_mib(agent.proc.pid))
    achieved = json.loads(load.stdout.read().strip().splitlines()[-1])["calls_per_second"] if load else 0
    if load:
        load.wait()
    time.sleep(1.5)  # the pipeline's last batch
    c1, t1 = cpu_s(agent.proc.pid), time.time()
    m1 = metrics(agent.url)
    events = total(m1, "gpuscope_agent_events_total") - total(m0, "gpuscope_agent_events_total")
    lost = total(m1, "gpuscope_agent_lost_events_total") - total(m0, "gpuscope_agent_lost_events_total")
    return {"rate_asked": rate, "calls_per_second": achieved, "events_per_second": events / (t1 - t0),
            "agent_cpu_share_of_a_core": (c1 - c0) / (t1 - t0), "agent_rss_mib_end": rss_mib(agent.proc.pid),
            "agent_rss_mib_peak": peak, "lost": lost}


def top_mappings(pid, n=8):
    """The mappings holding most of a process's resident memory (from /proc/PID/smaps)."""
    rows, current = [], None
    for line in open(f"/proc/{pid}/smaps"):
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
            current = parts[5] if len(parts) > 5 else "[anon]"
        elif line.startswith("Rss:") and current is not None:
            rows.append((int(parts[1]), current))
    by_name = {}
    for kib, name in rows:
        by_name[name] = by_name.get(name, 0) + kib
    return sorted(((kib / 1024, name) for name, kib in by_name.items()), reverse=True)[:n]


def part1(args):
    rows = []
    for budget in (1, DEFAULT_BUDGET):
        agent = Agent(args.build, budget, "gpu_sample_hz: 1\n")
        try:
            if budget == 1:
                time.sleep(2)
                print("idle agent's resident memory by mapping (MiB): " +
                      ", ".join(f"{name} {mib:.1f}" for mib, name in top_mappings(agent.proc.pid)), flush=True)
            for rate in args.rates:
                r = measure_rate(args.build, agent, rate, args.seconds, args.mode)
                r["budget"] = budget
                print(json.dumps(r), flush=True)
                rows.append(r)
        finally:
            agent.stop()
    print(f"\n{'budget':>6} {'asked/s':>9} {'calls/s':>9} {'events/s':>9} {'agent CPU':>10} {'RSS MiB':>8} "
          f"{'peak':>6} {'lost':>5}")
    for r in rows:
        print(f"{r['budget']:>6} {r['rate_asked']:>9} {r['calls_per_second']:>9.0f} {r['events_per_second']:>9.0f} "
              f"{r['agent_cpu_share_of_a_core'] * 100:>9.2f}% {r['agent_rss_mib_end']:>8.1f} "
              f"{r['agent_rss_mib_peak']:>6.1f} {r['lost']:>5.0f}")


def last_json(out):
    """The job's last line that is JSON, else {}."""
    for line in reversed(out.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {}


def workload_figure(out):
    """The workload's own figure (µs per op, from its last JSON line), else None."""
    return last_json(out).get("us_per_op")


def workload_launches(out):
    """The launches the job says it made (its last JSON line's "launches"), else None."""
    return last_json(out).get("launches")


def run_workload(cmd):
    start = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return workload_figure(out) or time.time() - start, out


def part2(args):
    cmd = shlex.split(args.workload)
    results = {"alone": [], "agent": []}
    agent_rows = []
    for rnd in range(args.rounds):
        wall, _ = run_workload(cmd)
        results["alone"].append(wall)
        print(json.dumps({"round": rnd, "config": "alone", "figure": wall}), flush=True)
        agent = Agent(args.build, args.budget, "gpu_sample_hz: 1\n" + "".join(f"{kv}\n" for kv in args.agent_config))
        try:
            c0 = cpu_s(agent.proc.pid)
            t0 = time.time()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            peak, last = 0.0, {}
            while proc.poll() is None:
                time.sleep(0.5)
                peak = max(peak, rss_mib(agent.proc.pid))
                try:
                    m = metrics(agent.url)
                    pid = f'pid="{proc.pid}"'
                    if total(m, "gpuscope_observed_ratio", pid):
                        last = {"observed_ratio": total(m, "gpuscope_observed_ratio", pid),
                                "probe_overhead_ratio": total(m, "gpuscope_probe_overhead_ratio", pid),
                                "launches_scaled": total(m, "gpuscope_kernel_launches_total", pid),
                                "probe_hits": total(m, "gpuscope_probe_hits_total", pid)}
                except OSError:
                    pass
            wall = time.time() - t0
            out = proc.stdout.read()
            figure = workload_figure(out) or wall
            made = workload_launches(out)
            if made:
                last["launches_made"] = made  # the job's own count, beside the agent's estimate
            row = {"round": rnd, "config": "agent", "figure": figure, **last,
                   "agent_cpu_share_of_a_core": (cpu_s(agent.proc.pid) - c0) / wall, "agent_rss_mib_peak": peak}
        finally:
            agent.stop()
        results["agent"].append(figure)
        agent_rows.append(row)
        print(json.dumps(row), flush=True)
    alone, under = statistics.median(results["alone"]), statistics.median(results["agent"])
    print(f"\nworkload: {args.workload}" + (f"; agent config: {', '.join(args.agent_config)}" if args.agent_config else ""))
    unit = "(µs/op, or s where the job prints none)"
    print(f"alone     median {alone:.3f} {unit}  ({min(results['alone']):.3f}..{max(results['alone']):.3f})")
    print(f"agent     median {under:.3f} {unit}  ({min(results['agent']):.3f}..{max(results['agent']):.3f})")
    print(f"slowdown  {100 * (under / alone - 1):+.2f}%  (budget {100 * args.budget:.2g}% of the process's CPU time)")
    for key in ("observed_ratio", "probe_overhead_ratio", "agent_cpu_share_of_a_core", "agent_rss_mib_peak"):
        vals = [r[key] for r in agent_rows if key in r]
        if vals:
            print(f"{key:28} median {statistics.median(vals):.4f}  ({min(vals):.4f}..{max(vals):.4f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=pathlib.Path, default=pathlib.Path(os.environ.get("BUILD", ROOT / "build")))
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rates", default="0,10000,100000")
    ap.add_argument("--mode", default="invalid", choices=["invalid", "real", "free-null"])
    ap.add_argument("--budget-check", action="store_true")
    ap.add_argument("--workload", default=f"{sys.executable} {ROOT}/bench/gpu/launch_bound.py --seconds 60",
                    help="command of a job that prints a JSON line with us_per_op (else its wall time counts)")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET)
    ap.add_argument("--agent-config", action="append", default=[],
                    help='a line for the agent\'s config file, e.g. "stack_every: 16" (repeatable)')
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    args.build = args.build.resolve()
    args.rates = [int(r) for r in args.rates.split(",")]
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    if args.budget_check:
        part2(args)
    else:
        part1(args)


if __name__ == "__main__":
    main()
