#!/usr/bin/env python3
"""The agent beside a long-running job: its CPU (share of one core) and resident memory every
--every seconds, the job's observed_ratio and probe overhead estimate, events and lost events.

    sudo bench/agent_soak.py [--build build] [--seconds 3600] [--every 10] [--profile-agent F] -- JOB ARGS...

Prints one JSON line per sample and a summary (max and final RSS, mean CPU share). With
--profile-agent, gpuscope itself samples the agent's CPU (999 Hz, from the second sample to the
end) and writes the agent's folded CPU stacks to F, with a summary of where its time went."""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from agent_cost import ROOT, Agent, cpu_s, metrics, rss_mib, total  # noqa: E402


def start_profiler(build, pid, folded):
    record = folded.with_suffix(".gpuscope")
    record.unlink(missing_ok=True)
    return subprocess.Popen([build / "gpuscope", "record", "-q", "--pid", str(pid), "--cpu-profile", "999",
                             "-o", record], stderr=subprocess.PIPE, text=True)


def stop_profiler(proc, build, folded):
    """Stops the recording and writes the folded stacks, with the agent's time by thread and
    by the functions most time is spent under."""
    proc.send_signal(2)
    err = proc.communicate(timeout=60)[1]
    record = folded.with_suffix(".gpuscope")
    out = subprocess.run([build / "gpuscope", "flamegraph", record, "--metric", "cpu", "-o", folded],
                         capture_output=True, text=True)
    if out.returncode:
        print(f"agent profile failed: {err}{out.stderr}")
        return
    stacks = []
    for line in folded.read_text().splitlines():
        path, value = line.rsplit(" ", 1)
        stacks.append((path.split(";"), int(value)))
    total = sum(v for _, v in stacks) or 1
    inclusive = {}
    for frames, v in stacks:
        for f in set(frames[1:]):
            inclusive[f] = inclusive.get(f, 0) + v
    print(f"\nagent CPU profile ({total / 1e9:.2f} s of CPU sampled): functions by inclusive share")
    for f, v in sorted(inclusive.items(), key=lambda kv: -kv[1])[:40]:
        print(f"  {100 * v / total:5.1f}%  {f[:160]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=pathlib.Path, default=pathlib.Path(os.environ.get("BUILD", ROOT / "build")))
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--every", type=float, default=10)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--profile-agent", type=pathlib.Path, help="write the agent's own folded CPU profile here")
    ap.add_argument("job", nargs="+")
    args = ap.parse_args()
    agent = Agent(args.build.resolve(), args.budget, "gpu_sample_hz: 1\n")
    job = subprocess.Popen(args.job, stdout=subprocess.DEVNULL)
    rows = []
    last = {}
    profiler = None
    try:
        start = time.time()
        c_prev, t_prev = cpu_s(agent.proc.pid), start
        while time.time() - start < args.seconds and job.poll() is None:
            time.sleep(args.every)
            c, t = cpu_s(agent.proc.pid), time.time()
            m = metrics(agent.url)
            sel = f'pid="{job.pid}"'
            row = {"t": round(t - start, 1), "agent_cpu_share": (c - c_prev) / (t - t_prev),
                   "agent_rss_mib": rss_mib(agent.proc.pid), "events": total(m, "gpuscope_agent_events_total"),
                   "lost": total(m, "gpuscope_agent_lost_events_total"),
                   "shed": total(m, "gpuscope_agent_shed_total"),
                   "job_observed_ratio": total(m, "gpuscope_observed_ratio", sel),
                   "job_probe_overhead_ratio": total(m, "gpuscope_probe_overhead_ratio", sel),
                   "job_launches_scaled": total(m, "gpuscope_kernel_launches_total", sel)}
            row["agent_observation_factor"] = total(m, "gpuscope_agent_observation_factor")
            c_prev, t_prev = c, t
            last = m
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.profile_agent and profiler is None:
                profiler = start_profiler(args.build.resolve(), agent.proc.pid, args.profile_agent)
    finally:
        if profiler:
            stop_profiler(profiler, args.build.resolve(), args.profile_agent)
        job.kill()
        job.wait()
        log = agent.stop()
    if not rows:
        sys.exit(f"no sample taken; agent log:\n{log}")
    cpu = [r["agent_cpu_share"] for r in rows]
    print(f"\n{len(rows)} samples over {rows[-1]['t']:.0f} s beside: {' '.join(args.job)}")
    print(f"agent CPU: mean {100 * statistics.mean(cpu):.2f}% of a core, max {100 * max(cpu):.2f}%")
    print(f"agent RSS: first {rows[0]['agent_rss_mib']:.1f} MiB, max {max(r['agent_rss_mib'] for r in rows):.1f}, "
          f"last {rows[-1]['agent_rss_mib']:.1f}")
    print(f"events {rows[-1]['events']:.0f}, lost {rows[-1]['lost']:.0f}, shed {rows[-1]['shed']:.0f}; job observed_ratio "
          f"{rows[-1]['job_observed_ratio']:.4f}, estimated probe overhead {rows[-1]['job_probe_overhead_ratio']:.4f}")
    print("lost by cause: " + ", ".join(f"{labels} {v:.0f}" for labels, v in last.get("gpuscope_agent_lost_events_total", [])
                                        if v))
    job_series = [(name, labels, v) for name, series in last.items() for labels, v in series
                  if f'pid="{job.pid}"' in labels and name != "gpuscope_kernel_launches_total"]
    print(f"the job's series at the last scrape (kernel launches left out): {len(job_series)}")
    own_pid = f'pid="{job.pid}",'
    for name, labels, v in job_series:
        print(f"  {name}{labels.replace(own_pid, '')} {v:g}")
    print("agent log:\n" + log)


if __name__ == "__main__":
    main()
