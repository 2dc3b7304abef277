#!/usr/bin/env python3
"""What a BPF stack walk costs per CUDA call and per frame: `record --bpf-stats` of the same
workloads with --call-stacks fp and eh-frame (and CPU samples with --sample-unwind fp and
eh-frame), rounds interleaved, medians printed. Needs root; no GPU (the calls fail without a
driver, but every one is a probe hit that takes a stack).

    sudo bench/ehframe_cost.py [--build build] [--gpuscope BIN] [--rounds 5] [--only NAME,...]

Per workload and mode: BPF ns per run of the programs that take stacks (call_entry and
call_entry_emit for calls, on_cpu_sample for samples), the mean depth of the stacks those runs
took (from the record's stack_frames), and for eh-frame the cost over fp per call and per frame
((eh - fp) / eh depth: what the table walk adds for each frame it walks)."""
import argparse
import json
import os
import pathlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CUDART = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64" / "libcudart.so.13"

# Launches through ctypes from a Python recursion that goes through C (map) at each level, so
# that the native stack crosses python3.11, _ctypes and libffi and is deep.
PY_DEEP = r"""
import ctypes, sys
cudart = ctypes.CDLL(sys.argv[1])
launch = cudart.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
grid = (1 << 32) | 1
def nest(d):
    if d == 0:
        for _ in range(int(sys.argv[2])):
            launch(0x1000, grid, 1, grid, 1, None, 0, None)
        return 0
    return list(map(nest, [d - 1]))[0]
nest(int(sys.argv[3]))
"""


def workloads(build):
    t = build / "targets"
    return {
        # name: (command, record options besides the stack mode, programs, mode flag)
        "cuda_ops_nofp": ([t / "cuda_ops_nofp", "--iterations", "3000"], [], ("call_entry", "call_entry_emit"),
                          "--call-stacks"),
        "launch_loop_d40": ([build / "bench/launch_loop", "--calls", "20000", "--depth", "40"], [],
                            ("call_entry", "call_entry_emit"), "--call-stacks"),
        "python_ctypes_d8": (["/usr/bin/python3", "-c", PY_DEEP, CUDART, "3000", "8"], ["--no-python"],
                             ("call_entry", "call_entry_emit"), "--call-stacks"),
        "samples_deep_stack": ([t / "deep_stack"], ["--cpu-profile", "999"], ("on_cpu_sample",),
                               "--sample-unwind"),
    }


def run_one(gpuscope, out, cmd, opts, progs, flag, mode):
    if out.exists():
        out.unlink()
    r = subprocess.run([gpuscope, "record", "--bpf-stats", flag, mode, *opts, "-o", out, "--", *cmd],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode not in (0, 3):
        sys.exit(f"record failed ({r.returncode}): {r.stderr}")
    db = sqlite3.connect(out)
    stats = json.loads(db.execute("SELECT value FROM meta WHERE key='bpf_program_stats'").fetchone()[0])
    runs = sum(stats.get(p, {}).get("runs", 0) for p in progs)
    ns = sum(stats.get(p, {}).get("run_time_ns", 0) for p in progs)
    table = "samples" if flag == "--sample-unwind" else "calls"
    depth = db.execute(f"SELECT avg(s.depth) FROM {table} x JOIN (SELECT stack_id, count(*) AS depth "
                       f"FROM stack_frames GROUP BY stack_id) s ON s.stack_id = x.stack_id").fetchone()[0] or 0
    lost = dict(db.execute("SELECT cause, count FROM lost WHERE count > 0 AND cause LIKE 'unwind%'").fetchall())
    db.close()
    return {"ns": ns / runs if runs else 0, "runs": runs, "depth": depth, "lost": lost}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--gpuscope", help="the gpuscope binary (default: BUILD/gpuscope), e.g. another build's")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--json", action="store_true", help="also print the medians as one JSON line")
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    gpuscope = pathlib.Path(args.gpuscope).resolve() if args.gpuscope else build / "gpuscope"
    wl = workloads(build)
    if args.only:
        wl = {k: v for k, v in wl.items() if k in args.only.split(",")}
    results = {name: {"fp": [], "eh-frame": []} for name in wl}
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "r.gpuscope"
        for _ in range(args.rounds):
            for name, (cmd, opts, progs, flag) in wl.items():
                for mode in ("fp", "eh-frame"):
                    results[name][mode].append(run_one(gpuscope, out, cmd, opts, progs, flag, mode))
    print(f"{'workload':20} {'fp ns':>8} {'fp depth':>8} {'eh ns':>8} {'eh depth':>8} "
          f"{'eh-fp ns':>9} {'ns/frame':>9}  unwind losses (last eh round)")
    summary = {}
    for name, r in results.items():
        med = {m: {k: statistics.median(x[k] for x in r[m]) for k in ("ns", "depth", "runs")} for m in r}
        fp, eh = med["fp"], med["eh-frame"]
        extra = eh["ns"] - fp["ns"]
        per_frame = extra / eh["depth"] if eh["depth"] else 0
        summary[name] = {"fp_ns": fp["ns"], "fp_depth": fp["depth"], "eh_ns": eh["ns"], "eh_depth": eh["depth"],
                         "eh_minus_fp_ns": extra, "ns_per_frame": per_frame, "runs": eh["runs"]}
        print(f"{name:20} {fp['ns']:8.0f} {fp['depth']:8.1f} {eh['ns']:8.0f} {eh['depth']:8.1f} "
              f"{extra:9.0f} {per_frame:9.1f}  {r['eh-frame'][-1]['lost'] or '-'}")
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
