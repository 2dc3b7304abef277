#!/usr/bin/env python3
"""What each part of gpuscope's launch probe costs inside a running PyTorch workload: runs
bench/probe_parts (stages of the probe, one program each, attached in turn to the driver's launch
functions) beside one ab_workload.py process, and between its rounds gpuscope's own probe
(`record --pid --no-stacks --bpf-stats`) on the same process, for the same figure.

    sudo python3 bench/gpu/probe_parts.py --build build-static [--workload train_step] [--rounds 3]
        [--window 3] [--ring-mb 64,4] [--gpuscope-b OTHER/gpuscope] [--programs p0_empty,p7_marks_sampling]
        [--workload-cpus 0-7 --apart-cpus 8-15]

The stages (bench/probe_parts.bpf.c): p0 empty; p1a the target filter (a hash lookup); p1b the
clock; p1c the attach cookie; p1 all three; p2 a call record reserved and submitted; p3 filled;
p4 with the stack arguments read; p5 with the thread's name; p6 with the wake-up check; p7 with
the thread's marks and the stack-sampling choice, all that the launch probe does without a stack;
s4 p4 into a 96-byte record. A stage named twice runs again once the ring has wrapped.

Prints each program's ns a run by round, then their medians, and gpuscope's call_entry_emit's
(with --gpuscope-b, each build's in every round, named by its file)."""
import argparse
import json
import pathlib
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attach_ab import Workload  # noqa: E402

LIBCUDA_SYMBOLS = ["cuLaunchKernel", "cuLaunchKernelEx"]


def find_libcuda(pid):
    for line in open(f"/proc/{pid}/maps"):
        path = line.split()[-1]
        if "libcuda.so" in path:
            return path
    return None


def gpuscope_emit_ns(gpuscope, pid, seconds, tmp, ring_mb, launch_probes, pin=(), flags=()):
    rec = pathlib.Path(tmp) / "parts.gpuscope"
    rec.unlink(missing_ok=True)
    proc = subprocess.Popen([*pin, gpuscope, "record", "-q", "--pid", str(pid), "--bpf-stats", "--no-stacks",
                             "--launch-probes", launch_probes, "--ringbuf-mb", str(ring_mb), *flags, "-o", str(rec)],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1 + seconds)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    if proc.returncode != 0:
        raise SystemExit(f"probe_parts: gpuscope failed: {err.strip()}")
    with sqlite3.connect(rec) as db:
        stats = json.loads(dict(db.execute("SELECT key, value FROM meta")).get("bpf_program_stats", "{}"))
    s = stats.get("call_entry_emit", {})
    return s.get("run_time_ns", 0) / max(s.get("runs", 1), 1), s.get("runs", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-static")
    ap.add_argument("--workload", default="train_step")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=3)
    ap.add_argument("--settle", type=float, default=1)
    ap.add_argument("--ring-mb", default="64", help="ring buffer sizes, each run in every round (e.g. 64,4)")
    ap.add_argument("--file", help="library to probe (default: the workload's libcuda)")
    ap.add_argument("--symbols", default=",".join(LIBCUDA_SYMBOLS))
    ap.add_argument("--launch-probes", default="driver", help="gpuscope's (both where launches fail before the driver)")
    ap.add_argument("--workload-cpus", help="pin the workload to these CPUs (taskset -c)")
    ap.add_argument("--apart-cpus", help="also run gpuscope pinned to these CPUs, apart from the workload's")
    ap.add_argument("--gpuscope-b", help="other gpuscope builds (comma-separated), run beside the first in every round")
    ap.add_argument("--programs", help="probe_parts' programs (default: all of its stages)")
    ap.add_argument("--flag-variants", help="more record flags, each set (';'-separated) run with the first build "
                                            "in every round, e.g. '--gpu-sample-hz 0'")
    args = ap.parse_args()
    build = pathlib.Path(args.build)
    parts = build / "bench" / "probe_parts"
    if not parts.exists():
        parts = build / "probe_parts"
    work = Workload(args.python, args.workload, args.workload_cpus)
    try:
        work.wait_steps(20, timeout=300)
        lib = args.file or find_libcuda(work.proc.pid)
        if not lib:
            raise SystemExit("probe_parts: the workload has no libcuda mapped")
        emit, parts_ns = {}, {}
        rings = [int(m) for m in args.ring_mb.split(",")]
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for ring in rings:
                    at = "" if len(rings) == 1 else f"@{ring}MiB"
                    chosen = ["--programs", args.programs] if args.programs else []
                    out = subprocess.run([str(parts), "--pid", str(work.proc.pid), "--rounds", "1", "--window",
                                          str(args.window), "--settle", str(args.settle), "--ring-mb", str(ring),
                                          *chosen, lib, *args.symbols.split(",")], capture_output=True, text=True)
                    if out.returncode != 0:
                        raise SystemExit(f"probe_parts failed: {out.stderr.strip()}")
                    for line in out.stdout.split("\n\n")[0].splitlines():
                        f = line.split()
                        parts_ns.setdefault(f[2] + at, []).append(float(f[5]))
                        print(f"round {r + 1} {f[2] + at} {' '.join(f[3:])}", flush=True)
                    others = args.gpuscope_b.split(",") if args.gpuscope_b else []
                    builds = [("", str(build / "gpuscope"), [])]
                    builds += [(f" [{f}]", str(build / "gpuscope"), f.split())
                               for f in (args.flag_variants.split(";") if args.flag_variants else [])]
                    builds += [(f" [{pathlib.Path(o).name}]", o, []) for o in others]
                    for (b, binary, flags), apart in [(bb, a) for bb in builds for a in ([False, True] if args.apart_cpus
                                                                                 else [False])]:
                        pin = ["taskset", "-c", args.apart_cpus] if apart else []
                        ns, runs = gpuscope_emit_ns(binary, work.proc.pid, args.window, tmp, ring,
                                                    args.launch_probes, pin, flags)
                        label = f"--ringbuf-mb {ring}" + (f", on CPUs {args.apart_cpus}" if apart else "") + b
                        emit.setdefault(label, []).append(ns)
                        print(f"round {r + 1} gpuscope call_entry_emit ({label}) {runs} runs {ns:.0f} ns a run",
                              flush=True)
        print(f"\n{'program':26} {'ns a run':>9} (min..max) over {args.rounds} rounds")
        for name, ns in parts_ns.items():
            print(f"{name:26} {statistics.median(ns):9.0f} ({min(ns):.0f}..{max(ns):.0f})")
        for label, ns in emit.items():
            print(f"gpuscope call_entry_emit (record --no-stacks {label}, {args.window:g} s): median "
                  f"{statistics.median(ns):.0f} ns a run ({min(ns):.0f}..{max(ns):.0f})")
    finally:
        work.proc.stdin.close()
        work.proc.wait(timeout=60)


if __name__ == "__main__":
    main()
