#!/usr/bin/env python3
"""The agent under stress (issue 30's fault injection): its memory stays bounded and it stays up.

    sudo bench/agent_stress.py flood [--threads 12] [--seconds 20] [--build build]
    sudo bench/agent_stress.py churn [--processes 10000] [--parallel 8] [--launches 50] [--no-agent]

flood: bench/launch_loop makes probed calls with THREADS threads as fast as they go (calls that
       fail inside the runtime: no GPU needed) while the agent traces every one (budget 1: no
       duty cycling). Every half second: the events the agent took per second, those it counted
       lost, its resident memory. The ring buffer and queues are bounded: past what the agent
       can take, events are lost and counted, and memory stays flat.
churn: PROCESSES short-lived CUDA programs ($BUILD/targets/launch_count LAUNCHES), PARALLEL at a
       time, under the agent's defaults. Its memory and CPU over the run, and what it still holds
       after: attached processes back to none, memory back near where it began.
Prints one line per sample and a summary."""
import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from agent_cost import ROOT, Agent, cpu_s, metrics, rss_mib, total  # noqa: E402


def stop_and_print(agent, summary):
    """Stops the agent and prints the summary (and the agent's log if it had died)."""
    log = agent.stop()
    print(json.dumps(summary))
    if not summary["agent_alive"]:
        print(log)


def flood(args):
    agent = Agent(args.build, 1, "gpu_sample_hz: 0\n")
    try:
        time.sleep(2)
        rss0 = rss_mib(agent.proc.pid)
        load = subprocess.Popen([str(args.build / "bench" / "launch_loop"), "--mode", "invalid", "--threads",
                                 str(args.threads), "--calls", str(10**9)], stdout=subprocess.DEVNULL)
        m_prev, t_prev, c0, t0 = metrics(agent.url), time.time(), cpu_s(agent.proc.pid), time.time()
        rates, samples = [], []
        while time.time() - t0 < args.seconds:
            time.sleep(0.5)
            m, t = metrics(agent.url), time.time()
            ev = (total(m, "gpuscope_agent_events_total") - total(m_prev, "gpuscope_agent_events_total")) / (t - t_prev)
            lost = (total(m, "gpuscope_agent_lost_events_total") -
                    total(m_prev, "gpuscope_agent_lost_events_total")) / (t - t_prev)
            rss = rss_mib(agent.proc.pid)
            samples.append(rss)
            rates.append((ev, lost))
            print(f"t={t - t0:5.1f}s events/s {ev:>10.0f} lost/s {lost:>10.0f} agent RSS {rss:7.1f} MiB", flush=True)
            m_prev, t_prev = m, t
        load.kill()
        load.wait()
        cpu = (cpu_s(agent.proc.pid) - c0) / (time.time() - t0)
        time.sleep(3)
        half = len(samples) // 2
        summary = {
            "threads": args.threads, "seconds": args.seconds,
            "events_per_second_mean": sum(r[0] for r in rates) / len(rates),
            "events_per_second_max": max(r[0] for r in rates),
            "offered_per_second_mean": sum(r[0] + r[1] for r in rates) / len(rates),
            "lost_per_second_mean": sum(r[1] for r in rates) / len(rates),
            "agent_cpu_cores": cpu, "agent_rss_mib_idle": rss0,
            "agent_rss_mib_first_half_max": max(samples[:half]), "agent_rss_mib_second_half_max": max(samples[half:]),
            "agent_rss_mib_peak": rss_mib(agent.proc.pid, "VmHWM"), "agent_rss_mib_after": rss_mib(agent.proc.pid),
            "agent_alive": agent.proc.poll() is None,
        }
    except BaseException:
        agent.stop()
        raise
    stop_and_print(agent, summary)


class NoAgent:
    """--no-agent: the same processes alone, for the time they take without the agent."""
    class proc:
        pid = os.getpid()

        @staticmethod
        def poll():
            return None
    url = None

    def stop(self):
        return ""


def churn(args):
    agent = NoAgent() if args.no_agent else Agent(args.build, 0.01, "")
    try:
        time.sleep(2)
        rss0, c0, t0 = rss_mib(agent.proc.pid), cpu_s(agent.proc.pid), time.time()
        target = [str(args.build / "targets" / "launch_count"), str(args.launches)]
        done = failed = 0
        samples = []
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            futures = [pool.submit(subprocess.run, target, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                       for _ in range(args.processes)]
            next_print = time.time() + 5
            for f in concurrent.futures.as_completed(futures):
                done += 1
                failed += f.result().returncode != 0
                if time.time() >= next_print:
                    rss = rss_mib(agent.proc.pid)
                    samples.append(rss)
                    print(f"t={time.time() - t0:6.1f}s {done:>6} processes done, agent RSS {rss:7.1f} MiB", flush=True)
                    next_print += 5
        elapsed = time.time() - t0
        cpu = cpu_s(agent.proc.pid) - c0
        time.sleep(5 if agent.url else 0)  # the exits' last exports
        m = metrics(agent.url) if agent.url else {}
        summary = {
            "processes": args.processes, "parallel": args.parallel, "launches_each": args.launches,
            "failed": failed, "seconds": elapsed, "processes_per_second": args.processes / elapsed,
            "agent_cpu_seconds": cpu, "agent_cpu_share_of_a_core": cpu / elapsed,
            "agent_rss_mib_start": rss0, "agent_rss_mib_peak": rss_mib(agent.proc.pid, "VmHWM"),
            "agent_rss_mib_max_sampled": max(samples, default=rss0), "agent_rss_mib_after": rss_mib(agent.proc.pid),
            "attached_processes_after": total(m, "gpuscope_agent_attached_processes"),
            "events": total(m, "gpuscope_agent_events_total"), "lost": total(m, "gpuscope_agent_lost_events_total"),
            "agent_alive": agent.proc.poll() is None,
        }
    except BaseException:
        agent.stop()
        raise
    stop_and_print(agent, summary)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["flood", "churn"])
    p.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 4))
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--processes", type=int, default=10000)
    p.add_argument("--parallel", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--launches", type=int, default=50)
    p.add_argument("--no-agent", action="store_true", help="churn: the processes alone (the baseline)")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("agent_stress.py needs root (the agent loads BPF programs)")
    args.build = args.build.resolve()
    flood(args) if args.what == "flood" else churn(args)


if __name__ == "__main__":
    main()
