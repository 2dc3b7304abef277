#!/usr/bin/env python3
"""What each tool adds to a step, measured inside one process: a workload runs for the whole
benchmark (ab_workload.py) while gpuscope is attached to it and detached again (`record --pid`),
and torch.profiler is switched on and off inside it, configuration after configuration, round
after round. Every configuration is compared with the baseline windows of the same process and
round, so what separates one PyTorch process from the next (on the H100, baselines of separate
runs spread over ±30%) does not enter the differences.

    sudo python3 bench/gpu/attach_ab.py --gpuscope build-static/gpuscope [--workload train_step]
        [--rounds 5] [--window 6] [--configs "baseline,floor,calls,+stacks,..."] [--out DIR]

Configurations:
  baseline               nothing attached
  floor                  gpuscope's probes on the same functions, running a BPF program that
                         does nothing (`record --floor-probes`): the traps alone, i.e. the floor
                         times the traps, the least any uprobe-based tool adds (issue 3)
  calls                  gpuscope record --no-stacks
  +stacks                gpuscope record --stack-every 1 (every call's stack, walked from .eh_frame
                         tables, the default since issue 29, and its Python stack)
  +stacks budget         gpuscope record (its default: launches', copies' and memsets' stacks
                         taken for one call in N, N set so that their walks take at most 0.5%
                         of the process's time; every stack while they take less)
  +stacks fp             gpuscope record --call-stacks fp --stack-every 1 (frame-pointer walks, the
                         default before issue 29; "... budget": by budget)
  +stacks eh-frame       gpuscope record --call-stacks eh-frame --stack-every 1 ("... budget": by budget)
  +stacks no python      gpuscope record --no-python --stack-every 1 (native frames only)
  +stacks +cpu 99Hz      gpuscope record --cpu-profile 99 --stack-every 1 (NVML at its default 10 Hz:
                         every gpuscope configuration has it, as in overhead.py)
  +stacks budget +cpu 99Hz  the same by budget
  +stacks 1/N            gpuscope record --stack-every N
  in-process calls       with --preload-hooks: record --pid claims the workload's launch ring, its
                         launches read without a trap each (--launch-probes in-process --no-stacks)
  in-process budget      the same with stacks by budget (record --pid's default for such a process)
  agent                  `gpuscope agent` (its default configuration: a 1% budget) started for the
                         window and stopped after it; it finds the running workload itself
  agent 1/16             the agent with `stack_every: 16`
  torch.profiler         CPU and CUDA activities
  torch.profiler+stack   the same with Python stacks
  X [b]                  gpuscope configuration X run with the build given by --gpuscope-b
  X [apart]              X with gpuscope on --apart-cpus, the workload on --workload-cpus
  X --flag V ...         gpuscope configuration X with more record flags, e.g. "calls --ringbuf-mb 4"
Every gpuscope configuration records with --bpf-stats (two clock reads a program run): its traps
per step are its uprobe programs' runs, and "BPF ms/step" their run time.
gpuscope attaches with --launch-probes driver (one trap per launch, what `record -- CMD` does once
the driver is probed; on a machine without a GPU, where launches fail before the driver, give
--launch-probes both). Like `record -- CMD`, it also removes the runtime's copy, memset and
sync probes once their calls were all seen to make a probed driver call (meta
runtime_probes_removed); the floor's traps are the probes' before that. Each window waits --settle seconds after the tool starts, then keeps the
steps that begin and end in the next --window seconds.

The agent duty-cycles its high-rate probes (on for a share of every 10 s), so its windows last
--agent-window seconds and are compared by their mean step, with the baseline windows' means:
a line per agent configuration after the table.

Prints, per configuration, the median step time (median over rounds of each window's median),
the added time (median and range of the per-round differences from that round's baseline), the
traps per step for gpuscope's configurations (probed calls and returns in its record over the
steps of its window), and then the figures the issues aim at; writes attach_ab.json to --out."""
import argparse
import json
import os
import pathlib
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import agent_cost  # noqa: E402  (bench/agent_cost.py: starting and reading the agent)

# "+stacks ..." take every call's stack (--stack-every 1); "+stacks budget ..." are record's
# default, the stacks of launches, copies and memsets within 1% of the process's time.
EVERY = ["--stack-every", "1"]
GPUSCOPE_CONFIGS = {
    "floor": ["--floor-probes", "--no-stacks", "--gpu-sample-hz", "0"],
    "calls": ["--no-stacks"],
    "+stacks": EVERY,
    "+stacks budget": [],
    "+stacks budget +cpu 99Hz": ["--cpu-profile", "99"],
    "+stacks fp": ["--call-stacks", "fp", *EVERY],
    "+stacks fp budget": ["--call-stacks", "fp"],
    "+stacks eh-frame": ["--call-stacks", "eh-frame", *EVERY],
    "+stacks eh-frame budget": ["--call-stacks", "eh-frame"],
    "+stacks no python": ["--no-python", *EVERY],
    "+stacks +cpu 99Hz": ["--cpu-profile", "99", *EVERY],
    "+stacks 1/2": ["--stack-every", "2"],
    "+stacks 1/4": ["--stack-every", "4"],
    "+stacks 1/4 +cpu 99Hz": ["--stack-every", "4", "--cpu-profile", "99"],
    "+stacks 1/16": ["--stack-every", "16"],
    "+stacks 1/16 +cpu 99Hz": ["--stack-every", "16", "--cpu-profile", "99"],
    "+stacks eh-frame 1/4": ["--call-stacks", "eh-frame", "--stack-every", "4"],
    "+stacks eh-frame 1/16": ["--call-stacks", "eh-frame", "--stack-every", "16"],
    "+stacks eh-frame 1/64": ["--call-stacks", "eh-frame", "--stack-every", "64"],
    # The workload started with libgpuscope_launches.so preloaded (--preload-hooks): its launches
    # read from its ring, claimed by record --pid, no trap each (issue 33).
    "in-process calls": ["--launch-probes", "in-process", "--no-stacks"],
    "in-process budget": ["--launch-probes", "in-process"],
}
AGENT_CONFIGS = {"agent": "", "agent 1/16": "stack_every: 16\n"}
PROFILER_CONFIGS = {"torch.profiler": "cuda", "torch.profiler+stack": "cuda+stack"}
DEFAULT_CONFIGS = "baseline,floor,calls,+stacks,+stacks budget,+stacks budget +cpu 99Hz,torch.profiler+stack"


class Workload:
    """The workload process, and the steps it has reported: (start_ns, end_ns, mode)."""

    def __init__(self, python, name, cpus=None, preload=None):
        pin = ["taskset", "-c", cpus] if cpus else []
        env = dict(os.environ)
        if preload:  # the hooks in standby, as a service's owner would start it
            env["LD_PRELOAD"] = ":".join(p for p in (str(pathlib.Path(preload).resolve()), env.get("LD_PRELOAD")) if p)
            env.pop("GPUSCOPE_LAUNCH_RING", None)
        self.proc = subprocess.Popen([*pin, python, str(HERE / "ab_workload.py"), name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        self.steps, self.modes, self.counts = [], [], []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            f = line.split()
            with self.cond:
                if f[:1] == ["step"]:
                    end, dur = int(f[1]), int(f[2])
                    self.steps.append((end - dur, end, f[3]))
                elif f[:1] == ["mode"]:
                    self.modes.append(f[1])
                elif f[:1] == ["count"]:
                    self.counts.append((int(f[1]), int(f[2]), json.loads(line.split(maxsplit=3)[3])))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_steps(self, n, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.steps) >= n or self.proc.poll() is not None, timeout):
                raise SystemExit(f"attach_ab: the workload made {len(self.steps)} steps in {timeout} s")
        if self.proc.poll() is not None:
            raise SystemExit(f"attach_ab: the workload exited ({self.proc.returncode})")

    def profiler(self, mode, timeout=300):
        with self.cond:
            n = len(self.modes)
            self.proc.stdin.write(f"profiler {mode}\n")
            self.proc.stdin.flush()
            if not self.cond.wait_for(lambda: len(self.modes) > n or self.proc.poll() is not None, timeout):
                raise SystemExit(f"attach_ab: the workload did not switch its profiler to {mode}")
            return self.modes[-1]

    def count(self, steps, timeout=300):
        """(t0, t1, kernel launches by name): `steps` steps run under torch.profiler (ab_workload's count)."""
        with self.cond:
            n = len(self.counts)
            self.proc.stdin.write(f"count {steps}\n")
            self.proc.stdin.flush()
            if not self.cond.wait_for(lambda: len(self.counts) > n or self.proc.poll() is not None, timeout):
                raise SystemExit("attach_ab: the workload did not count its kernels")
            return self.counts[-1]

    def durations(self, t0, t1, mode=None):
        with self.cond:
            return [e - s for s, e, m in self.steps if s >= t0 and e <= t1 and (mode is None or m == mode)]

    def count_between(self, t0, t1):
        with self.cond:
            return sum(1 for s, e, _ in self.steps if s >= t0 and e <= t1)

    def stop(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        except Exception:
            self.proc.kill()


def record_figures(path, pid):
    """Traps the record saw (a probed call is one trap, two with its return probe) and its span."""
    db = sqlite3.connect(path)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    calls, returns = db.execute("SELECT count(*), count(duration_ns) FROM calls WHERE pid = ?", (pid,)).fetchone()
    # --bpf-stats: every program's runs and run time; the uprobes' runs are the traps.
    stats = json.loads(meta.get("bpf_program_stats", "{}"))
    uprobes = ("call_entry", "call_entry_emit", "call_return", "calibration_hit")
    lost = db.execute("SELECT coalesce(sum(count), 0) FROM lost WHERE cause NOT LIKE 'unwind_%'").fetchone()[0]
    # Where the traps go: calls by function, with the driver call a runtime call made inside it
    # (its own entry and return traps) and how many had a return probe.
    functions = [list(r) for r in db.execute(
        "SELECT f.name, coalesce(d.name, ''), count(*), count(c.duration_ns) FROM calls c "
        "JOIN functions f ON f.id = c.func LEFT JOIN functions d ON d.id = c.driver_func "
        "WHERE c.pid = ? GROUP BY 1, 2 ORDER BY 3 DESC", (pid,))]
    db.close()
    return {"calls": calls, "returns": returns, "lost": lost, "start_ns": int(meta["start_ns"]),
            "end_ns": int(meta.get("end_ns", 0)), "recorder_cpu_s": int(meta.get("recorder_cpu_ns", 0)) / 1e9,
            "uprobe_runs": sum(stats.get(p, {}).get("runs", 0) for p in uprobes),
            "bpf_ns": sum(v.get("run_time_ns", 0) for v in stats.values()),
            "stack_every_max": int(meta.get("stack_every_max", 0)) or None,
            "stack_budget_result": meta.get("stack_budget_result"),
            "programs": {p: [v.get("runs", 0), v.get("run_time_ns", 0)] for p, v in stats.items()},
            "functions": functions}


def print_trap_breakdown(configs, figures):
    """Per step, summed over rounds: each BPF program's runs and mean run time, and the calls by
    function (a runtime call's driver call, made inside it, after the arrow)."""
    for c in configs:
        figs = [f for f in figures.get(c, []) if f.get("programs") and f.get("steps")]
        if not figs:
            continue
        steps = sum(f["steps"] for f in figs)
        progs, funcs = {}, {}
        for f in figs:
            for p, (runs, ns) in f["programs"].items():
                progs.setdefault(p, [0, 0])
                progs[p][0] += runs
                progs[p][1] += ns
            for name, drv, n, returned in f["functions"]:
                k = name + (f" -> {drv}" if drv else "")
                funcs.setdefault(k, [0, 0])
                funcs[k][0] += n
                funcs[k][1] += returned
        print(f"{c}: BPF programs a step (runs, ns a run): " + ", ".join(
            f"{p} {runs / steps:.1f} x {ns / runs:.0f}" for p, (runs, ns) in
            sorted(progs.items(), key=lambda kv: -kv[1][1]) if runs and runs / steps >= 0.05))
        if funcs:
            print(f"{c}: calls a step (with a return): " + ", ".join(
                f"{k} {n / steps:.1f} ({r / steps:.1f})" for k, (n, r) in
                sorted(funcs.items(), key=lambda kv: -kv[1][0]) if n / steps >= 0.05))


def gpuscope_config(args, c):
    """(command, flags) of a gpuscope configuration; "X [b]" is X run with --gpuscope-b, "X [apart]"
    X with gpuscope kept off the workload's CPUs (--apart-cpus)."""
    if " --" in c:
        base, extra = c.split(" --", 1)
        binary, flags = gpuscope_config(args, base)
        return binary, None if flags is None else [*flags, *("--" + extra).split()]
    if c.endswith(" [b]") and args.gpuscope_b:
        return [args.gpuscope_b], GPUSCOPE_CONFIGS.get(c[:-4])
    if c.endswith(" [apart]") and args.apart_cpus:
        return ["taskset", "-c", args.apart_cpus, args.gpuscope], GPUSCOPE_CONFIGS.get(c[:-8])
    return [args.gpuscope], GPUSCOPE_CONFIGS.get(c)


def gpuscope_window(args, work, flags, tmp, binary=None):
    """Attaches gpuscope, measures a window, detaches; returns (durations, figures)."""
    rec = tmp / "ab.gpuscope"
    rec.unlink(missing_ok=True)
    launches = [] if "--launch-probes" in flags else ["--launch-probes", args.launch_probes]
    proc = subprocess.Popen([*(binary or [args.gpuscope]), "record", "-q", "--pid", str(work.proc.pid), "--bpf-stats",
                             *launches, *flags, "-o", str(rec)], stderr=subprocess.PIPE, text=True)
    time.sleep(args.settle)
    if proc.poll() is not None:
        raise SystemExit(f"attach_ab: gpuscope {' '.join(flags)} exited: {proc.stderr.read().strip()}")
    t0 = time.monotonic_ns()
    time.sleep(args.window)
    t1 = time.monotonic_ns()
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=300)[1]
    if proc.returncode != 0:
        raise SystemExit(f"attach_ab: gpuscope {' '.join(flags)} failed ({proc.returncode}): {err.strip()}")
    fig = record_figures(rec, work.proc.pid)
    steps = work.count_between(fig["start_ns"], fig["end_ns"] or t1)
    fig["steps"] = steps
    fig["traps_per_step"] = fig["uprobe_runs"] / steps if steps else None
    fig["bpf_ms_per_step"] = fig["bpf_ns"] / 1e6 / steps if steps else None
    return work.durations(t0, t1), fig


def profiler_window(args, work, mode):
    got = work.profiler(mode)
    if got != mode:
        raise SystemExit(f"attach_ab: the workload cannot run torch.profiler ({got})")
    time.sleep(args.settle)
    t0 = time.monotonic_ns()
    time.sleep(args.profiler_window)
    t1 = time.monotonic_ns()
    work.profiler("none")  # its post-processing runs in the workload here, outside any window
    return work.durations(t0, t1, mode), {}


def agent_window(args, work, extra):
    """Starts the agent (bench/agent_cost.py's), measures a window once it serves metrics and has
    settled, stops it; returns (durations, figures: its own estimate of what it costs the workload)."""
    agent = agent_cost.Agent(pathlib.Path(args.gpuscope).parent, agent_cost.DEFAULT_BUDGET, f"gpu_sample_hz: 0\n{extra}")
    try:
        time.sleep(args.settle)
        t0 = time.monotonic_ns()
        time.sleep(args.agent_window)
        t1 = time.monotonic_ns()
        m = agent_cost.metrics(agent.url)
        pid = f'pid="{work.proc.pid}"'
        fig = {key: agent_cost.total(m, f"gpuscope_{key}", pid) for key in ("observed_ratio", "probe_overhead_ratio")
               if any(pid in labels for labels, _ in m.get(f"gpuscope_{key}", []))}
    finally:
        agent.stop()
    return work.durations(t0, t1), fig


def baseline_window(args, work):
    time.sleep(min(args.settle, 1.0))
    t0 = time.monotonic_ns()
    time.sleep(args.window)
    return work.durations(t0, time.monotonic_ns(), "none"), {}


def run_group(args, configs, tmp, label):
    """Runs one workload process through the rounds of these configurations."""
    work = Workload(args.python, args.workload, args.workload_cpus, args.preload_hooks)
    windows = {c: [] for c in configs}
    figures = {c: [] for c in configs}
    try:
        work.wait_steps(1, 600)
        time.sleep(args.warmup)
        if any(c.startswith("+stacks eh-frame") for c in configs):
            # Compiles the process's unwind tables into gpuscope's cache once, outside the rounds.
            gpuscope_window(args, work, GPUSCOPE_CONFIGS["+stacks eh-frame"], tmp)
        for r in range(args.rounds):
            # The order turns each round, so that no configuration always follows the same one.
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for c in order:
                if c == "baseline":
                    durs, fig = baseline_window(args, work)
                elif c in AGENT_CONFIGS:
                    durs, fig = agent_window(args, work, AGENT_CONFIGS[c])
                elif gpuscope_config(args, c)[1] is not None:
                    binary, flags = gpuscope_config(args, c)
                    durs, fig = gpuscope_window(args, work, flags, tmp, binary)
                else:
                    durs, fig = profiler_window(args, work, PROFILER_CONFIGS[c])
                if not durs:
                    raise SystemExit(f"attach_ab: no whole step in {c}'s window; make --window longer")
                windows[c].append(statistics.median(durs))
                figures[c].append({**fig, "window_steps": len(durs), "mean_ns": statistics.mean(durs)})
                print(f"{label}, round {r + 1}: {c:22} {statistics.median(durs) / 1e6:9.3f} ms/step over "
                      f"{len(durs)} steps" + (f", {fig['traps_per_step']:.1f} traps/step" if fig.get("traps_per_step") else ""),
                      flush=True)
    finally:
        work.stop()
    return windows, figures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpuscope", default=os.environ.get("GPUSCOPE", "build/gpuscope"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workload", default="train_step", help="a workloads.py workload, or ctypes_launch (no GPU)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=6, help="seconds of steps kept per window")
    ap.add_argument("--profiler-window", type=float, default=3,
                    help="seconds of steps kept under torch.profiler (it post-processes every event when it stops)")
    ap.add_argument("--settle", type=float, default=3, help="seconds between a tool's start and its window")
    ap.add_argument("--agent-window", type=float, default=20,
                    help="seconds of steps kept per agent window (whole cycles of its budget: 10 s each)")
    ap.add_argument("--warmup", type=float, default=5, help="seconds of steps before the first window")
    ap.add_argument("--launch-probes", default="driver",
                    help="gpuscope's --launch-probes (both: where launches never reach the driver, as without a GPU)")
    ap.add_argument("--preload-hooks", metavar="LIB",
                    help="start the workload with this libgpuscope_launches.so preloaded (in standby until a "
                         "configuration \"in-process ...\" claims its ring; baseline windows then include the "
                         "hooks in standby)")
    ap.add_argument("--gpuscope-b", help="another gpuscope build: configuration \"X [b]\" is X run with it")
    ap.add_argument("--workload-cpus", help="taskset the workload to these CPUs (e.g. 0-7)")
    ap.add_argument("--apart-cpus", help="configuration \"X [apart]\": X with gpuscope taskset to these CPUs (e.g. 8-15)")
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if (c != "baseline" and gpuscope_config(args, c)[1] is None and c not in PROFILER_CONFIGS
                and c not in AGENT_CONFIGS):
            raise SystemExit(f"attach_ab: unknown configuration {c!r}")
    if "baseline" not in configs:
        configs.insert(0, "baseline")

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="attach_ab."))
    windows = {}  # config -> per round: median step ns
    figures = {}
    bases = {}    # config -> the baseline windows of its own process, round by round
    # torch.profiler leaves CUPTI set up in the process once it has run, so its configurations
    # run in a second process of the same workload, with baseline windows of its own.
    groups = [[c for c in configs if c not in PROFILER_CONFIGS], [c for c in configs if c in PROFILER_CONFIGS]]
    for group in groups:
        if not group:
            continue
        if "baseline" not in group:
            group.insert(0, "baseline")
        label = "torch.profiler process" if any(c in PROFILER_CONFIGS for c in group) else "gpuscope process"
        w, f = run_group(args, group, tmp, label)
        for c in group:
            if c == "baseline" and "baseline" in windows:
                windows["baseline (torch.profiler process)"] = w[c]
                figures["baseline (torch.profiler process)"] = f[c]
                continue
            windows[c], figures[c] = w[c], f[c]
            bases[c] = w["baseline"]
    configs = list(windows)
    for c in configs:
        bases.setdefault(c, windows[c])

    base_ms = statistics.median(windows["baseline"]) / 1e6
    summary = {}
    print(f"\n{args.workload}, {args.rounds} rounds, windows of {args.window:g} s; added = the round's median "
          f"minus that round's baseline")
    print(f"{'configuration':22} {'ms/step':>9} {'x base':>7} {'added ms (range)':>26} {'traps/step':>10} "
          f"{'BPF ms/step':>11}")
    for c in configs:
        med = statistics.median(windows[c]) / 1e6
        diffs = [(w - b) / 1e6 for w, b in zip(windows[c], bases[c])]
        traps = [f["traps_per_step"] for f in figures[c] if f.get("traps_per_step")]
        bpf = [f["bpf_ms_per_step"] for f in figures[c] if f.get("bpf_ms_per_step")]
        summary[c] = {"ms_per_step": med, "rounds_ms": [w / 1e6 for w in windows[c]], "added_ms": statistics.median(diffs),
                      "added_ms_range": [min(diffs), max(diffs)], "traps_per_step": statistics.median(traps) if traps else None,
                      "bpf_ms_per_step": statistics.median(bpf) if bpf else None,
                      "figures": figures[c]}
        added = "" if c == "baseline" else f"{statistics.median(diffs):+8.3f} ({min(diffs):+.3f}..{max(diffs):+.3f})"
        print(f"{c:22} {med:9.3f} {med / base_ms:7.3f} {added:>26} "
              f"{(f'{statistics.median(traps):.1f}' if traps else ''):>10} "
              f"{(f'{statistics.median(bpf):.3f}' if bpf else ''):>11}")

    def added(c):
        return summary[c]["added_ms"] if c in summary else None
    print()
    if added("floor"):
        # The floor's traps are the probes' before gpuscope removes any (its empty programs
        # record nothing that could show a runtime call only wraps a driver call): compare each
        # configuration with the floor for its own traps too.
        floor_traps = summary["floor"]["traps_per_step"]
        for c in ("calls", "+stacks", "+stacks +cpu 99Hz", "+stacks eh-frame", "+stacks budget",
                  "+stacks budget +cpu 99Hz"):
            if added(c) is None:
                continue
            traps = summary[c]["traps_per_step"]
            own = f"; {added(c) / (added('floor') * traps / floor_traps):.2f}x the floor for its own {traps:.1f} " \
                  f"traps, against {floor_traps:.1f}" if traps and floor_traps and abs(traps - floor_traps) > 1 else ""
            print(f"{c} adds {added(c) / added('floor'):.2f}x what the traps alone add "
                  f"({added(c):+.3f} against {added('floor'):+.3f} ms a step{own})")
        # The same from BPF run time, which step times this noisy cannot show: the programs' time
        # above the empty program's, per trap, over the floor's added time per trap.
        floor_bpf = summary["floor"]["bpf_ms_per_step"]
        for c in configs:
            if c == "floor" or c not in summary or not summary[c].get("traps_per_step"):
                continue
            if summary[c]["bpf_ms_per_step"] and floor_bpf and floor_traps:
                traps = summary[c]["traps_per_step"]
                per_trap_floor = added("floor") / floor_traps
                extra = summary[c]["bpf_ms_per_step"] - floor_bpf * traps / floor_traps
                print(f"{c}: by BPF time, {1 + extra / (per_trap_floor * traps):.3f}x the floor for its "
                      f"{traps:.1f} traps ({extra * 1000:.1f} us of BPF a step above the empty program's; "
                      f"the floor's added step time gives {per_trap_floor * 1000:.2f} us a trap, as noisy as "
                      f"the steps: {1 + extra / (0.00355 * traps):.3f}x with PLATFORM.md's 3.55 us)")
    if added("calls") is not None:
        for c in ("+stacks", "+stacks eh-frame", "+stacks budget", "+stacks eh-frame budget"):
            if added(c) is not None:
                extra = added(c) - added("calls")
                print(f"{c} over calls: {extra:+.3f} ms a step, {100 * extra / base_ms:+.2f}% of the baseline step")
    for c in configs:
        ns = [f["stack_every_max"] for f in figures.get(c, []) if f.get("stack_every_max")]
        if ns:
            print(f"{c}: stacks of 1 call in at most {min(ns)}..{max(ns)} (by round); "
                  f"last round: {figures[c][-1].get('stack_budget_result')}")
    for c in configs:
        if c.endswith(" [b]") and added(c[:-4]) is not None:
            print(f"{c} against {c[:-4]}: {added(c) - added(c[:-4]):+.3f} ms a step")
    for c in configs:
        if c not in AGENT_CONFIGS:
            continue
        means = [f["mean_ns"] for f in figures[c]]
        base_means = [f["mean_ns"] for f in figures["baseline"]]
        pct = [100 * (m - b) / b for m, b in zip(means, base_means)]
        own = [f.get("probe_overhead_ratio") for f in figures[c] if f.get("probe_overhead_ratio") is not None]
        seen = [f.get("observed_ratio") for f in figures[c] if f.get("observed_ratio") is not None]
        summary[c]["mean_added_pct"] = statistics.median(pct)
        print(f"{c}: mean step {statistics.median(means) / 1e6:.3f} ms against the baseline's "
              f"{statistics.median(base_means) / 1e6:.3f}: {statistics.median(pct):+.2f}% in the median round "
              f"({min(pct):+.2f}..{max(pct):+.2f}; the aim: at most +1%)"
              + (f"; its own estimate of its probes' cost {100 * statistics.median(own):.2f}% of the job's CPU, "
                 f"observing {100 * statistics.median(seen):.1f}% of launches" if own and seen else ""))
    for c in ("+stacks", "+stacks budget", "+stacks budget +cpu 99Hz"):
        if added("torch.profiler+stack") is not None and added(c):
            print(f"torch.profiler+stack adds {added('torch.profiler+stack') / added(c):.1f}x what gpuscope "
                  f"{c} adds ({added('torch.profiler+stack'):+.3f} against {added(c):+.3f} ms a step)")
    print_trap_breakdown(configs, figures)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"attach_ab-{args.workload}.json").write_text(json.dumps(
            {"workload": args.workload, "rounds": args.rounds, "window_s": args.window, "configs": summary}, indent=1))


if __name__ == "__main__":
    main()
