#!/usr/bin/env python3
"""diagnose's fault-injection suite: runs bench/diagnose/workload.py (train, cnn, infer) under
`gpuscope record`, injects one fault at a time at two intensities, runs `gpuscope diagnose --json` on
each record and scores the findings against the fault injected. On the GPU machine, as root:

    python3 bench/diagnose/run.py --build build-static --out DIR [--workloads train,cnn,infer]
        [--scenarios clean,hog,...] [--intensities 1,2] [--seconds 8] [--lane 0]
    python3 bench/diagnose/run.py --score DIR        # the scores of the runs kept in DIR
    python3 bench/diagnose/run.py --live ...         # the agent instead: detection and root-cause latency
    python3 bench/diagnose/run.py --overhead ...     # the step time record and the agent add to clean runs
    python3 bench/diagnose/run.py --steady --seconds 120 ...  # the agent's CPU beside one job, settled
    python3 bench/diagnose/run.py --paired --seconds 200 --modes agent,agent-always ...
                                                 # what the agent adds, in turns beside one running job

Scenarios (the cause diagnose must rank first); those marked * are injected from outside, 1 s after
the workload says it is warm, until it ends; the others from inside the workload, all along:
  clean        none
  hog*         cpu_contention    1 (3) spinning processes on the CPU of the loop's thread
  quota*       cpu_throttling    the job's cgroup cpu.max at 0.5 (0.25) CPU
  pageable     pageable_copies   input from 16 (64) MB of pageable memory a step
  fsync        io_wait           an 8 (32) MB checkpoint written and fsynced every step
  item         sync_per_step     .item() once (twice) a step
  workers      input_wait        input from a worker (a DataLoader's workers) 1.5x (3x) slower than a step
  gil          lock_wait         1 (3) pure-Python preprocessing threads in the process
  small_batch  launch_bound      the batch divided by 16 (128)
  memory*      memory_pressure   the job reads its dataset (a 512 MB file) 8 MB a step; its cgroup's memory
                                 limited to its anonymous memory and half (a fifth) of its file pages
  remote       input_wait        input from a TCP server throttled in user space to 1.5x (3x) a step
  flood*       softirq           a loopback UDP flood steered (RPS) onto the loop's CPU, 1 (3) senders
  pcie*        pcie_contention   another process copying 256 MB buffers to (and from) the same GPU
  gpu_share*   gpu_contention    another process running matmuls on the same GPU, half (all) the time
  sleep        sleep             (not run by default) 5 (15) ms of time.sleep a step
Each run's record, diagnosis (JSON) and the injector's log (cause, start, end in CLOCK_MONOTONIC) are
kept in DIR; scores are printed from them: top-1 and top-3 accuracy, precision and recall per cause,
findings per hour on clean runs. --lane N runs on CPUs 4N+2.. and GPU N (several lanes on a host
with several GPUs, one process each)."""
import argparse
import array
import bisect
import concurrent.futures
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
# GPUSCOPE_DIAG_WORKLOAD: another script taking workload.py's options (to check this harness
# where there is no GPU).
WORKLOAD = os.environ.get("GPUSCOPE_DIAG_WORKLOAD", os.path.join(HERE, "workload.py"))


def workload_cmd(a, *args):
    """The workload's command line, with --scale where it is not 1 (a batch other than the
    workload's own, e.g. --scale 0.6667 for the training step's batch of 256 before 2026-11-29)."""
    return [a.python, WORKLOAD, *args] + (["--scale", str(a.scale)] if a.scale != 1 else [])
SCENARIOS = {  # name: (fault inside the workload, injected from outside, expected cause)
    "clean": ("none", None, "none"),
    "hog": ("none", "hog", "cpu_contention"),
    "quota": ("none", "quota", "cpu_throttling"),
    "pageable": ("pageable", None, "pageable_copies"),
    "fsync": ("fsync", None, "io_wait"),
    "item": ("item", None, "sync_per_step"),
    "workers": ("workers", None, "input_wait"),
    "gil": ("gil", None, "lock_wait"),
    "small_batch": ("small_batch", None, "launch_bound"),
    "memory": ("dataset", "memory", "memory_pressure"),
    "remote": ("remote", "server", "input_wait"),
    "flood": ("none", "flood", "softirq"),
    "pcie": ("none", "pcie", "pcie_contention"),
    "gpu_share": ("none", "gpu_share", "gpu_contention"),
    "sleep": ("sleep", None, "sleep"),  # not in the default set: a check of the harness
}
DEFAULT_SCENARIOS = [s for s in SCENARIOS if s != "sleep"]
CGROOT = "/sys/fs/cgroup"

PCIE_TENANT = r"""
import sys, torch
both = sys.argv[1] == "2"
h = torch.empty(64 << 20, dtype=torch.float32).pin_memory()
d = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
d.copy_(h); torch.cuda.synchronize()
print("ready", flush=True); sys.stdin.readline()  # set up before the fault begins (Injector.prepare)
while True:
    with torch.cuda.stream(s1):
        d.copy_(h, non_blocking=True)
    if both:
        with torch.cuda.stream(s2):
            h.copy_(d, non_blocking=True)
    s1.synchronize(); s2.synchronize()
"""
GPU_TENANT = r"""
import sys, time, torch
full = sys.argv[1] == "2"
n = 8192 if full else 4096
a = torch.randn(n, n, device="cuda"); b = torch.randn(n, n, device="cuda")
c = a @ b; torch.cuda.synchronize()
print("ready", flush=True); sys.stdin.readline()  # set up before the fault begins (Injector.prepare)
while True:
    t0 = time.perf_counter()
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    if not full:
        time.sleep(time.perf_counter() - t0)
"""
UDP_SINK = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
while True:
    s.recv(65536)
"""
UDP_SOURCE = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); m = b"x" * 1400; a = ("127.0.0.1", int(sys.argv[1]))
while True:
    for _ in range(1000):
        s.sendto(m, a)
"""


def log(*a):
    print(*a, flush=True)


def write(path, value):
    with open(path, "w") as f:
        f.write(value)


class Server:
    """The remote data source: sends what each client asks for (bytes a batch, period in ns), a
    batch every period, in 64 KiB chunks paced in user space."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.client, args=(c,), daemon=True).start()

    @staticmethod
    def client(c):
        try:
            hdr = b""
            while len(hdr) < 16:
                hdr += c.recv(16 - len(hdr))
            nbytes, period = int.from_bytes(hdr[:8], "little"), int.from_bytes(hdr[8:], "little") / 1e9
            chunk = b"\0" * 65536
            chunks = max(1, nbytes // len(chunk))
            while True:
                t0 = time.monotonic()
                sent = 0
                for k in range(chunks):
                    n = len(chunk) if k < chunks - 1 else nbytes - sent
                    c.sendall(chunk[:n] if n <= len(chunk) else chunk + b"\0" * (n - len(chunk)))
                    sent += n
                    # Spread over the period: a slow link, not a burst and a pause.
                    lag = t0 + period * (k + 1) / chunks - time.monotonic()
                    if lag > 0:
                        time.sleep(lag)
        except OSError:
            pass


class Injector:
    """Starts and stops a fault from outside the workload; keeps what it did."""

    def __init__(self, kind, intensity, lane, cgroup, python):  # cgroup: a Cgroup
        self.kind, self.hi, self.lane, self.cgroup, self.python = kind, intensity >= 2, lane, cgroup, python
        self.procs, self.undo, self.held = [], [], []

    def spawn(self, args, cpus=None, held=False):
        cmd = (["taskset", "-c", cpus] if cpus else []) + args
        self.procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE if held else subprocess.DEVNULL,
                                           stdin=subprocess.PIPE if held else None, stderr=subprocess.DEVNULL,
                                           env={**os.environ, "CUDA_VISIBLE_DEVICES": str(self.lane)}, text=True))
        if held:
            self.held.append(self.procs[-1])

    # The GPU tenants start (Python, torch, a CUDA context: seconds) beside the workload's own
    # start-up and wait, so that the fault begins at start(), not seconds into a 5 s run.
    def prepare(self):
        if self.kind == "pcie":
            self.spawn([self.python, "-c", PCIE_TENANT, "2" if self.hi else "1"], held=True)
        elif self.kind == "gpu_share":
            self.spawn([self.python, "-c", GPU_TENANT, "2" if self.hi else "1"], held=True)

    def start(self, loop_cpu):
        k = self.kind
        for p in self.held:
            if p.stdout.readline().strip() != "ready":
                raise OSError(f"the {k} tenant did not start (exit code {p.wait()})")
        for p in self.held:
            p.stdin.write("go\n")
            p.stdin.flush()
        if k == "hog":
            for _ in range(3 if self.hi else 1):
                self.spawn([self.python, "-c", "while True: pass"], str(loop_cpu))
        elif k == "quota":
            self.cgroup.cpu_quota(0.25 if self.hi else 0.5)
            self.undo.append(lambda: self.cgroup.cpu_quota(None))
        elif k == "memory":
            # Room for half (a fifth) of its file pages: its dataset no longer stays cached.
            self.cgroup.squeeze_files(0.2 if self.hi else 0.5)
            self.undo.append(lambda: self.cgroup.squeeze_files(None))
        elif k == "flood":
            rps = "/sys/class/net/lo/queues/rx-0/rps_cpus"
            old = open(rps).read().strip()
            write(rps, format(1 << loop_cpu, "x"))
            self.undo.append(lambda: write(rps, old))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            other = str((loop_cpu + 1) % os.cpu_count())
            self.spawn([self.python, "-c", UDP_SINK, str(port)], other)
            time.sleep(0.2)
            for _ in range(3 if self.hi else 1):
                self.spawn([self.python, "-c", UDP_SOURCE, str(port)], other)
        return time.monotonic()

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        for u in self.undo:
            with contextlib.suppress(OSError):
                u()
        return time.monotonic()


class Cgroup:
    """The run's cgroup: v2 where /sys/fs/cgroup is unified (the GPU machine), else v1's cpu and
    memory hierarchies."""

    def __init__(self, name):
        self.v2 = os.path.exists(f"{CGROOT}/cgroup.controllers")
        if self.v2:
            with contextlib.suppress(OSError):
                write(f"{CGROOT}/cgroup.subtree_control", "+cpu +memory")
            self.cpu = self.mem = f"{CGROOT}/gsdiag-{name}"
            self.dirs = [self.cpu]
        else:
            self.cpu, self.mem = f"{CGROOT}/cpu/gsdiag-{name}", f"{CGROOT}/memory/gsdiag-{name}"
            self.dirs = [d for d in (self.cpu, self.mem) if os.path.isdir(os.path.dirname(d))]
        for d in self.dirs:
            os.makedirs(d, exist_ok=True)

    def procs_files(self):
        return [f"{d}/cgroup.procs" for d in self.dirs]

    def cpu_quota(self, cpus):
        if self.v2:
            write(f"{self.cpu}/cpu.max", f"{int(cpus * 100000)} 100000" if cpus else "max 100000")
        else:
            write(f"{self.cpu}/cpu.cfs_period_us", "100000")
            write(f"{self.cpu}/cpu.cfs_quota_us", str(int(cpus * 100000)) if cpus else "-1")

    def squeeze_files(self, keep):
        """Limits the cgroup's memory to its anonymous memory and `keep` of its file pages (no swap
        here: anonymous memory cannot go); None lifts the limit."""
        stat = dict(l.split() for l in open(f"{self.mem}/memory.stat") if len(l.split()) == 2)
        if self.v2:
            limit = int(stat["anon"]) + int(int(stat["file"]) * keep) if keep is not None else "max"
            write(f"{self.mem}/memory.high", str(limit))
        elif keep is None:
            write(f"{self.mem}/memory.limit_in_bytes", "-1")
        else:
            # v1 refuses (EBUSY) a limit it cannot reclaim down to at once: raised until it takes.
            limit = int(stat["rss"]) + int(int(stat["cache"]) * keep)
            for _ in range(40):
                try:
                    write(f"{self.mem}/memory.limit_in_bytes", str(limit))
                    break
                except OSError:
                    limit = int(limit * 1.05) + (1 << 20)

    def remove(self):
        for d in self.dirs:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)


def run_one(a, lane, workload, scenario, intensity):
    fault, outside, expected = SCENARIOS[scenario]
    name = f"{workload}-{scenario}-{intensity}"
    rec = os.path.join(a.out, name + ".gpuscope")
    ready = os.path.join(a.out, name + ".ready")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(ready)
    cg = Cgroup(f"{lane}-{name}")
    loop_cpu = (4 * lane + 2) % os.cpu_count()
    server = Server() if outside == "server" else None
    inj = Injector(outside, intensity, lane, cg, a.python) if outside and outside != "server" else None
    if inj:
        inj.prepare()
    wl = workload_cmd(a, "--workload", workload, "--fault", fault, "--intensity", str(intensity),
                      "--seconds", str(a.seconds), "--ready", ready, "--cpu", str(loop_cpu), "--dir", a.out)
    if server:
        wl += ["--port", str(server.port)]
    inner = " ".join(f"'{x}'" for x in wl)
    join = " && ".join(f"echo $$ > {f}" for f in cg.procs_files())
    cmd = ["sh", "-c", f"{join} && exec {inner}" if join else f"exec {inner}"]
    if not a.live:
        cmd = [f"{a.build}/gpuscope", "record", "-q", "-o", rec] + a.record_args + ["--"] + cmd
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(lane)}
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    entry = {"run": name, "workload": workload, "scenario": scenario, "intensity": intensity,
             "expected": expected, "fault_from": None, "fault_to": None}
    live = LiveWatch(a, expected) if a.live else None
    ready_at = None
    deadline = t0 + a.seconds + 180
    while p.poll() is None:
        if time.monotonic() > deadline:  # a workload that hangs costs its run, not the suite
            entry["error"] = "timed out"
            os.killpg(p.pid, signal.SIGKILL)
            break
        if ready_at is None and os.path.exists(ready):
            ready_at = float(open(ready).read())
            entry["ready"] = ready_at
            if inj:
                time.sleep(1)
                try:
                    entry["fault_from"] = inj.start(loop_cpu)
                except OSError as e:
                    entry["inject_error"] = str(e)
                    log(f"{name}: could not inject {outside}: {e}")
            else:
                entry["fault_from"] = ready_at if fault != "none" else None
            if live:
                live.onset(entry["fault_from"] or ready_at + 1, workload_pid=p.pid)
        if live and ready_at is not None:
            live.poll()
        time.sleep(0.1)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # a child left holding its output
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    entry["fault_to"] = inj.stop() if inj else (time.monotonic() if fault != "none" else None)
    if server:
        server.sock.close()
    cg.remove()
    entry["wall_s"] = time.monotonic() - t0
    m = re.search(r"([\d.]+) ms a step", out)
    entry["step_ms"] = float(m.group(1)) if m else None
    entry["rc"] = p.returncode
    if p.returncode:
        entry["error"] = err[-600:]
    if live:
        entry.update(live.result())
    elif not p.returncode:
        # Diagnosed beside the next run, on CPUs no lane uses.
        return DIAGNOSES.submit(diagnose_one, a, rec, name, entry)
    return finish(a, entry)


def diagnose_one(a, rec, name, entry):
    entry["record_mb"] = os.path.getsize(rec) / 1e6
    spare = list(range(os.cpu_count() - 8, os.cpu_count())) if os.cpu_count() >= 24 else []
    cmd = (["taskset", "-c", ",".join(map(str, spare))] if spare else []) + [
        f"{a.build}/gpuscope", "diagnose", "--json", rec]
    t0 = time.monotonic()
    d = subprocess.run(cmd, capture_output=True, text=True)
    entry["diagnose_s"] = time.monotonic() - t0
    entry["diagnose_rc"] = d.returncode
    if d.returncode == 0:
        open(os.path.join(a.out, name + ".json"), "w").write(d.stdout)
        entry["diagnosis"] = summarise(json.loads(d.stdout))
    else:
        entry["error"] = d.stderr[-600:]
    if not a.keep_records:
        os.unlink(rec)
    return finish(a, entry)


def finish(a, e):
    with RUNS_LOCK, open(os.path.join(a.out, "runs.jsonl"), "a") as f:
        f.write(json.dumps(e) + "\n")
    if "diagnosis" in e:
        f = e["diagnosis"]["findings"]
        log(f"{e['run']:28} {e['step_ms'] or 0:7.2f} ms  expected {e['expected']:16} top "
            f"{f[0]['cause'] if f else '?'}  (diagnose {e.get('diagnose_s', 0):.1f} s, {e.get('record_mb', 0):.0f} MB)")
    elif "detect_s" in e:
        log(f"{e['run']:28} detected {e['detect_s']} root cause {e['root_cause_s']}; top after the onset (polls): "
            f"{e.get('live_tops')}; last {e.get('live_last')}")
    else:
        log(f"{e['run']:28} FAILED rc {e['rc']}: {e.get('error', '')}")
    return e


RUNS_LOCK = threading.Lock()
DIAGNOSES = concurrent.futures.ThreadPoolExecutor(max_workers=4)


def summarise(doc):
    """The workload's process (the busiest), its findings and its GPU's view."""
    if not doc["processes"]:
        return {"findings": [], "notes": doc["notes"]}
    p = doc["processes"][0]
    b = p.get("breakdown") or {}
    return {"pid": p["pid"], "steps": p["steps"]["count"], "p50_ms": p["steps"]["p50_ms"],
            "slow": p["steps"]["slow"], "gpu_busy": b.get("gpu_busy_share"),
            "findings": [{"cause": f["cause"], "share": f["share_of_step"], "evidence": f["evidence"]}
                         for f in p["findings"]]}


class LiveWatch:
    """Polls the agent's /metrics: detection is the first instant after the onset that the loop's
    step time rises 20% over its median before it, or any finding appears; the root cause, the
    first that the expected cause is the loop's top finding."""

    def __init__(self, a, expected):
        self.url, self.expected = f"http://127.0.0.1:{a.agent_port}/metrics", expected
        self.t_onset = self.pid = None
        self.before, self.detected, self.rooted = [], None, None
        self.tops = {}  # top finding after the onset -> polls it was top in (what was found instead)
        self.last = {}
        self.evidence, self.polls = None, 0  # /debug/diagnosis for the process, read every 10 polls
        self.wrong_evidence = []
        self.process_series = {}  # the agent's last series of the process (is it seen at all?)

    def onset(self, t, workload_pid):
        self.t_onset, self.pid = t, str(workload_pid)

    def poll(self):
        try:
            text = urllib.request.urlopen(self.url, timeout=2).read().decode()
        except OSError:
            return
        now = time.monotonic()
        step, shares = None, {}
        for line in text.splitlines():
            if line.startswith("gpuscope_step_seconds{") and f'pid="{self.pid}"' in line:
                step = float(line.rsplit(" ", 1)[1])
            elif line.startswith("gpuscope_finding_share{") and f'pid="{self.pid}"' in line:
                c = re.search(r'cause="([^"]+)"', line).group(1)
                shares[c] = float(line.rsplit(" ", 1)[1])
        top = max(shares.items(), key=lambda kv: kv[1])[0] if shares else "none"
        if now < self.t_onset:
            if step:
                self.before.append(step)
            return
        self.tops[top] = self.tops.get(top, 0) + 1
        self.polls += 1
        for line in text.splitlines():
            if f'pid="{self.pid}"' in line and line.split("{", 1)[0] in (
                    "gpuscope_observed_ratio", "gpuscope_probe_hits_total", "gpuscope_kernel_launches_total"):
                self.process_series[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
        # /debug/diagnosis every 10 polls, and at each of the first 5 polls where a wrong cause is
        # on top (its evidence, kept apart: what a clean run's false finding rested on).
        wrong = top not in ("none", self.expected)
        if self.polls % 10 == 0 or (wrong and len(self.wrong_evidence) < 5):
            try:
                doc = json.loads(urllib.request.urlopen(self.url.replace("/metrics", "/debug/diagnosis"), timeout=2).read())
                mine = next((p for p in doc if str(p["pid"]) == self.pid), None)
                if mine:
                    self.evidence = mine
                    if wrong and mine.get("findings"):
                        self.wrong_evidence.append({"t": round(now - self.t_onset, 2), "findings": mine["findings"]})
            except (OSError, ValueError):
                pass
        if shares:
            self.last = {c: round(v, 3) for c, v in sorted(shares.items(), key=lambda kv: -kv[1])[:3]}
        base = sorted(self.before)[len(self.before) // 2] if self.before else None
        if self.detected is None and ((step and base and step > 1.2 * base) or top != "none"):
            self.detected = now - self.t_onset
        if self.rooted is None and top == self.expected:
            self.rooted = now - self.t_onset

    def result(self):
        return {"detect_s": self.detected, "root_cause_s": self.rooted, "live_tops": self.tops, "live_last": self.last,
                "live_diagnosis": self.evidence, "wrong_evidence": self.wrong_evidence,
                "process_series": self.process_series}


# A fault that slows the step less than this (against the same workload's clean run) had no effect
# to find: a GPU-bound job shrugs off a CPU hog. Such runs are scored apart: right if the top
# finding is `none` or the cause injected.
MIN_EFFECT = 0.05
BATCH = {"train": 384, "cnn": 128, "infer": 16}  # workload.py's batches


def score(out):
    runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl"))]
    runs = [r for r in runs if "diagnosis" in r or "detect_s" in r]
    clean = {}
    for r in runs:
        if r["scenario"] == "clean" and r.get("step_ms"):
            clean.setdefault(r["workload"], []).append(r["step_ms"])
    clean = {w: sorted(v)[len(v) // 2] for w, v in clean.items()}

    def effect(r):
        base = clean.get(r["workload"])
        if not base or not r.get("step_ms"):
            return None
        step = r["step_ms"]
        if r["scenario"] == "small_batch":  # less work a step: compared per sample
            full = BATCH[r["workload"]]
            step *= full / max(1, full // (128 if r["intensity"] >= 2 else 16))
        return step / base - 1

    def effective(r):
        e = effect(r)
        return r["scenario"] == "clean" or e is None or e >= MIN_EFFECT

    by = {}
    top1 = top3 = n = 0
    idle_ok = idle_n = 0
    clean_findings, clean_s = 0, 0.0
    log(f"{'run':28} {'step ms':>8} {'slower':>7} {'busy':>5}  expected -> found (share)")
    for r in runs:
        if "diagnosis" not in r:
            continue
        f = r["diagnosis"]["findings"]
        causes = [x["cause"] for x in f]
        got = causes[0] if causes else "?"
        hit1, hit3 = got == r["expected"], r["expected"] in causes[:3]
        e = effect(r)
        if effective(r):
            n += 1
            top1 += hit1
            top3 += hit3
            by.setdefault(r["expected"], {"tp": 0, "fn": 0, "fp": 0})
            by.setdefault(got, {"tp": 0, "fn": 0, "fp": 0})
            if hit1:
                by[got]["tp"] += 1
            else:
                by[r["expected"]]["fn"] += 1
                by[got]["fp"] += 1
            mark = "HIT " if hit1 else "top3" if hit3 else "MISS"
        else:
            idle_n += 1
            ok = got in ("none", r["expected"])
            idle_ok += ok
            mark = "n/e " if ok else "N/E!"
        if r["scenario"] == "clean":
            clean_findings += sum(1 for x in f if x["cause"] != "none" and x["share"] >= 0.05)
            clean_s += a_seconds(r)
        busy = r["diagnosis"].get("gpu_busy")
        log(f"{r['run']:28} {r['step_ms'] or 0:8.2f} {'' if e is None else f'{e * 100:+6.0f}%':>7} "
            f"{'' if busy is None else f'{busy * 100:4.0f}%':>5}  {mark} {r['expected']} -> "
            + ", ".join(f"{x['cause']} {x['share'] * 100:.0f}%" for x in f[:3]))
    if n:
        log(f"\nruns where the fault slowed the step {MIN_EFFECT * 100:.0f}% or more (and clean runs): {n}")
        log(f"top-1 {top1}/{n} = {top1 / n * 100:.1f}%   top-3 {top3}/{n} = {top3 / n * 100:.1f}%")
        log(f"{'cause':18} precision  recall")
        for c, v in sorted(by.items()):
            p = v["tp"] / (v["tp"] + v["fp"]) if v["tp"] + v["fp"] else float("nan")
            rc = v["tp"] / (v["tp"] + v["fn"]) if v["tp"] + v["fn"] else float("nan")
            log(f"{c:18} {p:9.2f} {rc:7.2f}")
        if clean_s:
            log(f"clean runs: {clean_findings} findings over 5% in {clean_s:.0f} s = "
                f"{clean_findings / clean_s * 3600:.1f} an hour")
    if idle_n:
        log(f"runs where the fault had no effect (n/e): {idle_n}, diagnosed none or the fault: {idle_ok}/{idle_n}")
    ds = sorted(r["diagnose_s"] for r in runs if r.get("diagnose_s") is not None)
    if ds:
        log(f"diagnose took {ds[len(ds) // 2]:.1f} s (median), {ds[-1]:.1f} s at most, on records of "
            f"{sorted(r['record_mb'] for r in runs if 'record_mb' in r)[-1]:.0f} MB at most")
    quiet = [r for r in runs if "live_tops" in r and r["scenario"] == "clean"]
    if quiet:
        polls = sum(sum(r["live_tops"].values()) for r in quiet)
        found = sum(n for r in quiet for c, n in r["live_tops"].items() if c != "none")
        log(f"live, clean runs: a finding in {found} of {polls} polls of /metrics "
            f"({', '.join(f'{c} {n}' for r in quiet for c, n in r['live_tops'].items() if c != 'none') or 'none'})")
    lat = [r for r in runs if "detect_s" in r and r["scenario"] != "clean"]
    if lat:
        def pct(v, q):
            v = sorted(v)
            return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
        d = [r["detect_s"] for r in lat if r["detect_s"] is not None]
        c = [r["root_cause_s"] - (r["detect_s"] or 0) for r in lat if r["root_cause_s"] is not None]
        log(f"live: detected {len(d)}/{len(lat)}, p50 {pct(d, .5):.1f} s p95 {pct(d, .95):.1f} s; root cause "
            f"{len(c)}/{len(lat)}, after detection p50 {pct(c, .5):.1f} s p95 {pct(c, .95):.1f} s")


def a_seconds(r):
    return max(0.0, (r.get("wall_s") or 0))


@contextlib.contextmanager
def agent(a, gpu_hz=10, budget=None, extra="", suite=True):
    cfg = os.path.join(a.out, "agent.yaml")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    a.agent_port = s.getsockname()[1]
    s.close()
    # The suite's: profiles every second and NVML at 10 Hz; otherwise the agent's defaults. Lines of
    # `extra` replace those of the same key.
    keys = {"listen": f"127.0.0.1:{a.agent_port}", "cpu_profile_hz": a.cpu_hz}
    if suite:
        keys.update(interval="1s", gpu_sample_hz=gpu_hz)
    if budget is not None:
        keys["budget"] = budget
    for line in extra.splitlines():
        k, _, v = line.partition(":")
        keys[k.strip()] = v.strip()
    write(cfg, "".join(f"{k}: {v}\n" for k, v in keys.items()))
    logf = open(os.path.join(a.out, "agent.log"), "w")
    p = subprocess.Popen(["taskset", "-c", "0", f"{a.build}/gpuscope", "agent", "--config", cfg]
                         + (["-v"] if a.agent_verbose else []), stderr=logf)
    deadline = time.time() + 60
    while "serving /metrics" not in open(logf.name).read():
        if p.poll() is not None or time.time() > deadline:
            raise SystemExit(f"the agent did not start: {open(logf.name).read()[-500:]}")
        time.sleep(0.1)
    try:
        yield p
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()


def steady(a):
    """The agent's CPU and memory beside one clean workload once both have settled: from 30 s after
    the workload starts to its end (run it for --seconds 90 or more). The agent runs with its
    defaults but --cpu-hz (until 2026-11-27 with the suite's profiles every second and NVML at 10
    Hz). The suite's figure includes every new process's start-up (attaching, unwind tables for
    PyTorch's libraries)."""
    with agent(a, suite=False) as ag:
        w = a.workloads.split(",")[0]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(a.lane)}
        p = subprocess.Popen(workload_cmd(a, "--workload", w, "--seconds", str(a.seconds), "--dir", a.out),
                             stdout=subprocess.PIPE, text=True, env=env)
        time.sleep(30)
        cpu0, t0, threads0 = cpu_seconds(ag.pid), time.monotonic(), thread_cpu(ag.pid)
        samples = []
        while p.poll() is None:
            time.sleep(10)
            if p.poll() is None:
                samples.append((time.monotonic() - t0, cpu_seconds(ag.pid) - cpu0, rss_mib(ag.pid)))
                log(f"{30 + samples[-1][0]:5.0f} s: agent CPU {samples[-1][1] / samples[-1][0] * 100:.2f}% of a core "
                    f"since 30 s, RSS {samples[-1][2]:.1f} MiB")
        out = p.stdout.read()
        if samples:
            t, c, _ = samples[-1]
            log(f"{w}: agent CPU {c / t * 100:.2f}% of a core from 30 s to {30 + t:.0f} s "
                f"(cpu_profile_hz {a.cpu_hz}), RSS at most {max(r for _, _, r in samples):.1f} MiB; {out.strip()}")
            log(f"by thread: {thread_split(threads0, thread_cpu(ag.pid), t)}")


def thread_cpu(pid):
    """CPU seconds of each of the process's threads, by name (gpuscope names its threads gs-*)."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            fields = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def thread_split(before, after, seconds):
    """Each thread's share of a core between two thread_cpu() readings, the largest first."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return ", ".join(f"{k} {v / seconds * 100:.2f}%" for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v > 0)


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def overhead(a):
    """Each clean workload alone, under `gpuscope record` (its defaults: host telemetry, NVML,
    stacks within their budget) and beside the agent (CPU sampling at --cpu-hz), interleaved
    --rounds times; the median step time of each and what gpuscope adds. `agent-gpu1`: the agent
    reading NVML once a second (the default) instead of the suite's 10 times; `agent-always`: its
    probes on throughout (budget 1), not cycled under the 1% budget; `agent:KEY=VALUE;...`: the
    agent with those lines added to its configuration (`agent:diagnose=false`), to find what costs."""
    times = {}
    modes = a.modes.split(",")
    for rnd in range(a.rounds):
        for w in a.workloads.split(","):
            for mode in modes:
                wl = workload_cmd(a, "--workload", w, "--seconds", str(a.seconds), "--dir", a.out)
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(a.lane)}
                if mode == "record":
                    wl = [f"{a.build}/gpuscope", "record", "-q", "-o", os.path.join(a.out, "overhead.gpuscope"), "--"] + wl
                if mode.startswith("agent"):
                    ctx = agent_mode(a, mode)
                else:
                    ctx = contextlib.nullcontext()
                with ctx as ag:
                    cpu0, t0 = (cpu_seconds(ag.pid), time.monotonic()) if ag else (0, 0)
                    out = subprocess.run(wl, capture_output=True, text=True, env=env).stdout
                    agent_cpu = (cpu_seconds(ag.pid) - cpu0) / (time.monotonic() - t0) if ag else None
                m = re.search(r"([\d.]+) ms a step", out)
                if not m:
                    log(f"{w} {mode}: no step time: {out[-300:]}")
                    continue
                times.setdefault((w, mode), []).append(float(m.group(1)))
                log(f"round {rnd} {w:6} {mode:6} {float(m.group(1)):8.3f} ms a step"
                    + (f"; agent CPU {agent_cpu * 100:.2f}% of a core" if agent_cpu is not None else ""))
    for w in a.workloads.split(","):
        base = sorted(times.get((w, "alone"), [0]))[len(times.get((w, "alone"), [0])) // 2]
        for mode in [m for m in modes if m != "alone"]:
            v = sorted(times.get((w, mode), [0]))
            med = v[len(v) // 2]
            if base:
                log(f"{w:6} {mode:6} median {med:8.3f} ms vs {base:8.3f} alone: {(med / base - 1) * 100:+.2f}%")


def agent_mode(a, mode, suite=True):
    """The agent of an --overhead or --paired mode: agent, agent-gpu1, agent-always, agent:KEY=VALUE;..."""
    extra = "".join(f"{kv.replace('=', ': ', 1)}\n" for kv in mode.partition(":")[2].split(";") if kv)
    return agent(a, gpu_hz=1 if mode == "agent-gpu1" else 10, budget=1 if mode == "agent-always" else None,
                 extra=extra, suite=suite)


def paired(a):
    """What the agent adds to one running job, measured inside it: the workload runs once for
    --seconds and records the end of each step; the agent is started and stopped beside it in
    turns (--segment seconds each: alone, a mode, alone, the next mode, ...), so that every
    agent segment is compared with the alone segments either side of it in the same process (no
    run-to-run spread of clocks, memory placement or start-up). The first --settle seconds of each
    segment are left out: the agent attaching (and its first on-period at full duty), or the
    probes' release. The agent runs with its defaults but --cpu-hz (not the suite's 1 s profiles
    and 10 Hz NVML). Prints each segment and, per mode, the added step time: the median and the
    spread over its segments."""
    modes = a.modes.split(",")
    modes = [m for m in modes if m != "alone"] or ["agent"]
    w = a.workloads.split(",")[0]
    series = os.path.join(a.out, "paired-series.bin")
    ready = os.path.join(a.out, "paired-ready")
    for f in (series, ready):
        if os.path.exists(f):
            os.unlink(f)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(a.lane)}
    p = subprocess.Popen(workload_cmd(a, "--workload", w, "--seconds", str(a.seconds), "--dir", a.out,
                                      "--ready", ready, "--series", series), stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not os.path.exists(ready):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the workload did not get ready: {p.stdout.read()[-300:] if p.stdout else ''}")
        time.sleep(0.1)
    loop_end = float(open(ready).read()) + a.seconds
    segments = []  # (mode, start, end)
    i = 0
    while time.monotonic() + a.segment + 2 < loop_end and p.poll() is None:
        mode = "alone" if i % 2 == 0 else modes[(i // 2) % len(modes)]
        t0 = time.monotonic()
        if mode == "alone":
            time.sleep(a.segment)
        else:
            with agent_mode(a, mode, suite=False) as ag:
                t0 = time.monotonic()  # from the agent serving: its start-up is its own
                time.sleep(a.segment)
                cpu = cpu_seconds(ag.pid)
            log(f"segment {i} {mode}: agent CPU {cpu / (time.monotonic() - t0) * 100:.2f}% of a core over its life")
        segments.append((mode, t0, time.monotonic()))
        i += 1
    out = p.communicate()[0]
    ends = array.array("d")
    with open(series, "rb") as f:
        ends.frombytes(f.read())
    log(out.strip())
    report_paired(ends, segments, a.settle)


def report_paired(ends, segments, settle):
    """Mean step time in each segment (past its first `settle` seconds), and each agent segment
    against the mean of the alone segments either side."""
    def mean_step(t0, t1):
        lo, hi = bisect.bisect_left(ends, t0 + settle), bisect.bisect_right(ends, t1)
        n = hi - lo - 1
        return (ends[hi - 1] - ends[lo]) / n * 1e3 if n >= 10 else None
    means = [(mode, mean_step(t0, t1)) for mode, t0, t1 in segments]
    added = {}
    for k, (mode, ms) in enumerate(means):
        line = f"segment {k:2} {mode:24} " + (f"{ms:8.3f} ms a step" if ms else "too few steps")
        if mode != "alone" and ms:
            around = [m for _, m in (means[k - 1:k] + means[k + 1:k + 2]) if m]
            if around:
                base = sum(around) / len(around)
                added.setdefault(mode, []).append((ms / base - 1) * 100)
                line += f"  {added[mode][-1]:+6.2f}% against the alone segments beside it ({base:.3f} ms)"
        log(line)
    for mode, v in added.items():
        v = sorted(v)
        log(f"{mode}: added step time median {v[len(v) // 2]:+.2f}% over {len(v)} segments "
            f"(spread {v[0]:+.2f}% .. {v[-1]:+.2f}%)")
    alone = sorted(m for mode, m in means if mode == "alone" and m)
    if len(alone) > 1:
        log(f"alone segments: {alone[0]:.3f} .. {alone[-1]:.3f} ms a step (the job's own drift)")


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/diagnose-suite")
    ap.add_argument("--workloads", default="train,cnn,infer")
    ap.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS))
    ap.add_argument("--intensities", default="1,2")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--lane", type=int, default=0)
    ap.add_argument("--lanes", type=int, default=1,
                    help="run on GPUs 0..N-1 at once, a run on each (CPUs 4k+2.. for lane k); flood runs alone "
                         "at the end (its packet steering is the host's)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies each workload's batch (workload.py --scale)")
    ap.add_argument("--record-args", default="", help="more options for gpuscope record")
    ap.add_argument("--keep-records", action="store_true")
    ap.add_argument("--skip-done", action="store_true", help="skip the runs that DIR/runs.jsonl already holds")
    ap.add_argument("--live", action="store_true", help="the agent's live findings instead of record+diagnose")
    ap.add_argument("--cpu-hz", type=int, default=100, help="the agent's CPU sampling (--live)")
    ap.add_argument("--agent-verbose", action="store_true", help="the agent's debugging detail in OUT/agent.log")
    ap.add_argument("--score", metavar="DIR", help="print the scores of the runs in DIR and stop")
    ap.add_argument("--overhead", action="store_true",
                    help="the clean workloads alone, under record and beside the agent: the step time gpuscope adds")
    ap.add_argument("--rounds", type=int, default=3, help="--overhead: interleaved rounds")
    ap.add_argument("--modes", default="alone,record,agent",
                    help="--overhead: of alone, record, agent, agent-gpu1, agent-always, agent:KEY=VALUE;...")
    ap.add_argument("--paired", action="store_true",
                    help="the agent started and stopped beside one running job, in turns (see paired())")
    ap.add_argument("--segment", type=float, default=12, help="--paired: seconds of each segment")
    ap.add_argument("--settle", type=float, default=4, help="--paired: seconds left out at a segment's start")
    ap.add_argument("--steady", action="store_true",
                    help="the agent's CPU beside one clean workload (the first of --workloads) from 30 s on")
    a = ap.parse_args()
    if a.score:
        score(a.score)
        return
    if os.geteuid() != 0:
        raise SystemExit("run.py injects faults through cgroups and records with eBPF: run it as root")
    a.record_args = a.record_args.split()
    os.makedirs(a.out, exist_ok=True)
    if a.overhead:
        overhead(a)
        return
    if a.steady:
        steady(a)
        return
    if a.paired:
        paired(a)
        return
    todo = [(w, s, int(i)) for w in a.workloads.split(",") for s in a.scenarios.split(",")
            for i in (a.intensities.split(",") if s != "clean" else ["1"])]
    if a.skip_done and os.path.exists(os.path.join(a.out, "runs.jsonl")):
        done = {json.loads(l)["run"] for l in open(os.path.join(a.out, "runs.jsonl"))}
        todo = [t for t in todo if f"{t[0]}-{t[1]}-{t[2]}" not in done]
    for s in {s for _, s, _ in todo}:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s}; known: {', '.join(SCENARIOS)}")
    ctx = agent(a) if a.live else contextlib.nullcontext()
    def one(lane, w, s, i):
        run_one(a, lane, w, s, i)

    with ctx as ag:
        cpu0, t0 = (cpu_seconds(ag.pid), time.monotonic()) if ag else (0, 0)
        threads0 = thread_cpu(ag.pid) if ag else {}
        lanes = 1 if a.live else max(1, a.lanes)
        if lanes == 1:
            for w, s, i in todo:
                one(a.lane, w, s, i)
        else:
            shared = [t for t in todo if t[1] != "flood"]
            work = [shared[k::lanes] for k in range(lanes)]
            threads = [threading.Thread(target=lambda k=k: [one(k, *t) for t in work[k]]) for k in range(lanes)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for t in todo:
                if t[1] == "flood":
                    one(0, *t)
        if ag:
            log(f"agent CPU: {(cpu_seconds(ag.pid) - cpu0) / (time.monotonic() - t0) * 100:.2f}% of a core "
                f"(CPU sampling {a.cpu_hz} Hz)")
            log(f"by thread: {thread_split(threads0, thread_cpu(ag.pid), time.monotonic() - t0)}")
    DIAGNOSES.shutdown(wait=True)
    score(a.out)


if __name__ == "__main__":
    main()
