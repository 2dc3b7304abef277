#!/usr/bin/env python3
"""Are the agent's counts right for a process whose true count is known?

    sudo bench/agent_counts.py [--build build] [--runs 10] [--churn] [--launches 1007] [--seconds 0]
                               [--after-ms 0] [--budget 0.01] [--target PATH]

Starts `gpuscope agent` (its default settings, or --budget), optionally with process churn
beside it (--churn: two shell loops running /bin/true and ls, as on a busy node), then runs the
target (tests/targets/launch_count: exactly N launches of one kernel, spread over --seconds, the
first --after-ms after its start) --runs times, one after the other. For each run it scrapes
/metrics every 50 ms and keeps the last values exported for the target's pid (an exited process
is exported once more, then dropped): its gpuscope_kernel_launches_total, gpuscope_observed_ratio,
gpuscope_counts_exact and gpuscope_estimate_error_ratio (where exported), and the agent's
gpuscope_agent_observation_factor at the time. Prints one JSON line per run and a summary: runs
exact, runs estimated within 5%, runs wrong (an exact-marked count that is not the truth, or an
estimate more than 5% off), runs missed (no series: the agent found the process after it exited).
--target runs another program (a command line) instead; its true count is --launches, or the
"launches" of a JSON line it prints (bench/py_launch_loop.py --seconds 20 prints one)."""
import argparse
import json
import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url):
    out = {}
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if m:
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out


def of_pid(m, name, pid):
    return [v for labels, v in m.get(name, []) if labels.get("pid") == str(pid)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--churn", action="store_true")
    ap.add_argument("--launches", type=int, default=1007)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--after-ms", type=float, default=0)
    ap.add_argument("--budget", type=float, default=0)
    ap.add_argument("--target", default="")
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    target = shlex.split(args.target) if args.target else [
        str(build / "targets" / "launch_count"), str(args.launches), "--over", str(args.seconds), "--after",
        str(args.after_ms)]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="agent-counts-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp / "agent.yaml").write_text(f"listen: 127.0.0.1:{port}\n" + (f"budget: {args.budget}\n" if args.budget else ""))
    log = open(tmp / "agent.log", "w+")
    agent = subprocess.Popen([str(build / "gpuscope"), "agent", "--config", str(tmp / "agent.yaml")], stderr=log)
    churn = []
    try:
        deadline = time.time() + 60
        while True:
            log.flush()
            if "serving /metrics" in (tmp / "agent.log").read_text():
                break
            if agent.poll() is not None or time.time() > deadline:
                sys.exit("the agent did not start: " + (tmp / "agent.log").read_text())
            time.sleep(0.1)
        if args.churn:
            for cmd in ("while :; do /bin/true; done", "while :; do ls / >/dev/null; done"):
                churn.append(subprocess.Popen(["bash", "-c", cmd], start_new_session=True))
            time.sleep(3)  # long enough for the agent's CPU share (read each second) to feel it
        results = []
        for run in range(args.runs):
            out_path = tmp / f"target-{run}.out"
            with open(out_path, "w") as out:
                proc = subprocess.Popen(target, stdout=out)
            last, seen, factor, exited_at = None, False, None, None
            deadline = time.time() + 60
            while time.time() < deadline:
                if exited_at is None and proc.poll() is not None:
                    exited_at = time.time()
                if not seen and exited_at is not None and time.time() > exited_at + 3:
                    break  # never exported: the agent found it after it had exited
                m = scrape(url)
                launches = of_pid(m, "gpuscope_kernel_launches_total", proc.pid)
                if launches:
                    seen = True
                    last = {"launches": sum(launches),
                            "observed_ratio": (of_pid(m, "gpuscope_observed_ratio", proc.pid) or [None])[0],
                            "counts_exact": (of_pid(m, "gpuscope_counts_exact", proc.pid) or [None])[0],
                            "error_bound": (of_pid(m, "gpuscope_estimate_error_ratio", proc.pid) or [None])[0]}
                    factor = [v for _, v in m.get("gpuscope_agent_observation_factor", [])]
                elif seen and proc.poll() is not None:
                    break  # dropped after the export that followed its exit: `last` is final
                time.sleep(0.05)
            proc.wait()
            truth = args.launches
            for line in out_path.read_text().splitlines():
                try:
                    truth = int(json.loads(line)["launches"])
                except (ValueError, KeyError, TypeError):
                    pass
            r = {"run": run, "pid": proc.pid, "truth": truth, **(last or {"launches": 0}),
                 "observation_factor": factor[0] if factor else None}
            est = r["launches"]
            if last is None:
                r["verdict"] = "missed (no series: found after it exited)"
            elif r.get("counts_exact") == 1 or (r.get("counts_exact") is None and r.get("observed_ratio") == 1):
                r["verdict"] = "exact" if est == truth else "WRONG (marked exact)"
            else:
                r["verdict"] = "estimate within 5%" if abs(est - truth) <= 0.05 * truth else "WRONG (estimate off by more than 5%)"
            if last is not None and r.get("error_bound") is not None:
                r["within_stated_bound"] = abs(est - truth) <= r["error_bound"] * est
            print(json.dumps(r), flush=True)
            results.append(r)
        counts = {}
        for r in results:
            counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        print(json.dumps({"summary": counts, "churn": args.churn, "budget": args.budget or "default",
                          "launches": [r["launches"] for r in results]}))
    finally:
        for c in churn:
            os.killpg(c.pid, signal.SIGKILL)
            c.wait()
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
        log.close()


if __name__ == "__main__":
    main()
