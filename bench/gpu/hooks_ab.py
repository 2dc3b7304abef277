#!/usr/bin/env python3
"""What the in-process launch hooks (record's default for a command, issue 33) add to a step,
measured inside one process: `gpuscope record` starts one workload (ab_workload.py) and the hooks'
switch (the ring header's `paused`, reached through /proc/PID/map_files) turns them off and on in
windows, round after round; torch.profiler with stacks is switched on and off in the same process
(hooks off) for comparison. Each window is compared with the off window of its own round, so what
separates one PyTorch process from the next (±30% and more on the H100 VM) does not enter.

    sudo python3 bench/gpu/hooks_ab.py --gpuscope build-static/gpuscope [--workloads eager_add,...]
        [--rounds 5] [--window 4] [--settle 1] [--record-flags "..."]

Configurations, each a window:
  off                   the hooks paused: launches go straight to the driver, unrecorded (the rest
                        of record's probes stay: allocations, copies, memsets, syncs, lookups)
  on                    the hooks recording every launch, one in N handed to the stack probe (N from
                        record's stack budget), as by default
  torch.profiler+stack  the hooks paused, torch.profiler with CPU and CUDA activities and Python stacks
What "on" adds over "off" is what collecting launches in the process costs the step; record's other
probes cost the same in both (bench/gpu/attach_ab.py measures what attaching all of them adds).
Prints per workload the median step of each configuration (median over rounds of each window's
median) and the added time (median and range of the per-round differences from that round's off
window; the median of the per-round percentages), and the ratio torch.profiler+stack / hooks.
torch.profiler's rounds come after the hooks' (it leaves the process slower once it stops), each
with an off window of its own."""
import argparse
import mmap
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attach_ab import Workload  # noqa: E402

PAUSED_OFFSET = 44  # gs_launch_ring_header.paused (src/inject/launch_ring.h)
CONFIGS = ["off", "on", "torch.profiler+stack"]


class RecordedWorkload(Workload):
    """ab_workload.py started by `gpuscope record`, its hooks' switch mapped here."""

    def __init__(self, gpuscope, python, name, record, flags):
        self.proc = subprocess.Popen(
            [gpuscope, "record", "-q", *flags, "-o", record, "--", python, str(HERE / "ab_workload.py"), name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env=dict(os.environ, GPUSCOPE_LAUNCH_PAUSED="1", OPENBLAS_NUM_THREADS="1"))
        self.steps, self.modes = [], []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.switch = None

    def map_switch(self):
        """The workload's ring header, mapped: the workload is gpuscope's child."""
        children = pathlib.Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        for pid in children:
            for line in pathlib.Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "memfd:gpuscope-launches" in line:
                    span = line.split()[0]
                    fd = os.open(f"/proc/{pid}/map_files/{span}", os.O_RDWR)
                    try:
                        self.switch = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                    finally:
                        os.close(fd)
                    return int(pid)
        raise SystemExit("hooks_ab: the workload has no launch ring (is libgpuscope_launches.so beside gpuscope?)")

    def hooks(self, on):
        self.switch[PAUSED_OFFSET:PAUSED_OFFSET + 4] = (0 if on else 1).to_bytes(4, "little")


def window(args, work, config):
    work.hooks(config == "on")
    mode = "cuda+stack" if config == "torch.profiler+stack" else "none"
    if work.profiler(mode) != mode:
        raise SystemExit(f"hooks_ab: the workload could not switch its profiler to {mode}")
    time.sleep(args.settle)
    t0 = time.monotonic_ns()
    time.sleep(args.window)
    durs = work.durations(t0, time.monotonic_ns(), mode)
    if mode != "none":
        work.profiler("none")  # its post-processing here, outside the next window
    return durs


def run_workload(args, name, tmp):
    work = RecordedWorkload(args.gpuscope, args.python, name, str(tmp / f"{name}.gpuscope"),
                            args.record_flags.split())
    configs = args.configs.split(",")
    # torch.profiler leaves the process slower after its window ends (on the H100 the off windows
    # after the first profiler window took 30-50% longer): its rounds come last, each with an off
    # window of its own.
    hooks = [c for c in configs if c != "torch.profiler+stack"]
    medians = {c: [] for c in configs}
    medians_before_profiler = {"off": [], "torch.profiler+stack": []}
    plan = [(r, hooks[r % len(hooks):] + hooks[:r % len(hooks)], medians) for r in range(args.rounds)]
    if "torch.profiler+stack" in configs:
        plan += [(args.rounds + r, ["off", "torch.profiler+stack"], medians_before_profiler)
                 for r in range(args.profiler_rounds)]
    try:
        work.wait_steps(1, 600)
        pid = work.map_switch()
        time.sleep(args.warmup)
        for r, order, into in plan:
            for c in order:
                durs = window(args, work, c)
                if not durs:
                    raise SystemExit(f"hooks_ab: no whole step in {c}'s window; make --window longer")
                into[c].append(statistics.median(durs))
                print(f"{name} (PID {pid}), round {r + 1}: {c:22} {statistics.median(durs) / 1e6:9.4f} ms/step over "
                      f"{len(durs)} steps", flush=True)
    finally:
        work.stop()
        work.proc.wait(timeout=120)
    return {c: v for c, v in medians.items() if v}, medians_before_profiler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workloads", default="eager_add,generation,lstm_infer,multi_stream")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=4.0, help="seconds of steps kept a window")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds after a switch before the window")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--record-flags", default="", help="more flags for gpuscope record")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="of: " + ", ".join(CONFIGS) + " (off first)")
    ap.add_argument("--profiler-rounds", type=int, default=2, help="rounds of torch.profiler+stack, after the others")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads.split(","):
            # Each workload's table as soon as it is measured (a run cut short keeps the others').
            summarise(name, *run_workload(args, name, pathlib.Path(tmp)))


def summarise(name, m, m_profiler):
    print(f"\n{'workload':14} {'configuration':22} {'ms/step':>9} {'added ms (range)':>28} {'added %':>8}")
    added = {}
    for group in (m, m_profiler):
        if not group.get("off"):
            continue
        off = statistics.median(group["off"])
        for c in group:
            if c == "off" and group is m_profiler:
                continue
            diffs = [x - o for x, o in zip(group[c], group["off"])]
            pct = [100 * (x - o) / o for x, o in zip(group[c], group["off"])]
            added[c] = statistics.median(pct)
            print(f"{name:14} {c:22} {statistics.median(group[c]) / 1e6:9.4f} {statistics.median(diffs) / 1e6:+10.4f} "
                  f"({min(diffs) / 1e6:+.4f}..{max(diffs) / 1e6:+.4f}) {added[c]:+7.2f}%", flush=True)
    if "on" in added and "torch.profiler+stack" in added:
        hooks, prof = added["on"], added["torch.profiler+stack"]
        ratio = f"{prof / hooks:.1f}x" if hooks > 0 else "the hooks added nothing measurable"
        print(f"{name:14} torch.profiler+stack / hooks (added %): {ratio}", flush=True)


if __name__ == "__main__":
    main()
