#!/usr/bin/env python3
"""What walking Python frames costs per CUDA call, by Python stack depth: `record --bpf-stats`
of a ctypes launch loop (libcudart's, or the driver's where there is one) under N levels of Python recursion, with and without Python frames
(--no-python), rounds interleaved, for one or more gpuscope binaries (e.g. two builds). Needs
root; no GPU (the launches fail without a driver, but each is a probe hit that takes a stack).

    sudo bench/python_walk_cost.py [--gpuscope BIN ...] [--depths 1,5,20,60] [--rounds 3]

Prints, per binary and depth, the BPF ns per launch probe run (median of the rounds) with and
without Python frames, and the difference: what the Python walk costs at that depth."""
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

# Pure Python recursion: the frames sit next to each other in the interpreter's data stack.
PY_NEST = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
if hasattr(lib, "cuLaunchKernel"):
    # The driver's launch of no function: an error, before and without a context (a real
    # driver would crash on a made-up function, where the runtime without one fails first).
    launch = lambda: lib.cuLaunchKernel(None, 1, 1, 1, 32, 1, 1, 0, None, None, None)
else:
    f = lib.cudaLaunchKernel
    f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                  ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    grid = (1 << 32) | 1
    launch = lambda: f(0x1000, grid, 1, grid, 1, None, 0, None)
def nest(d):
    if d == 0:
        for _ in range(int(sys.argv[2])):
            launch()
        return 0
    x = [1, 2, 3]
    return nest(d - 1)
class Nest:
    # Calling an instance enters the interpreter from C (slot_tp_call), as each nn.Module call
    # does: 3.12+ puts a shim frame on the C stack between each level's frames.
    def __call__(self, d):
        if d == 0:
            return nest(0)
        x = [1, 2, 3]
        return self(d - 1)
(Nest() if sys.argv[4] == "c" else nest)(int(sys.argv[3]))
"""


def bpf_ns(gpuscope, out, python, cudart, depth, calls, with_python, nest):
    out.unlink(missing_ok=True)
    opts = [] if with_python else ["--no-python"]
    r = subprocess.run([gpuscope, "record", "-q", "--bpf-stats", *opts, "-o", out, "--", python, "-c", PY_NEST,
                        cudart, str(calls), str(depth), nest], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode not in (0, 3):
        sys.exit(f"record failed ({r.returncode}): {r.stderr.strip()}")
    db = sqlite3.connect(out)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    db.close()
    stats = json.loads(meta["bpf_program_stats"])
    s = stats.get("call_entry_emit", {})
    # What record says of its Python walks (builds since python_walks was added; none with --no-python).
    return s.get("run_time_ns", 0) / s["runs"] if s.get("runs") else float("nan"), meta.get("python_walks", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpuscope", nargs="+", default=[str(ROOT / "build" / "gpuscope")])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--cudart", default=str(CUDART),
                    help="the library the loop launches through (ctypes): a libcudart (no driver here) or, "
                         "where there is a GPU, the driver's libcuda.so.1")
    ap.add_argument("--depths", default="1,5,20,60")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nest", choices=("python", "c"), default="python",
                    help="recursion from Python to Python, or through C (calling a class instance, as "
                         "nn.Module calls do)")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    ns = {}
    walks = {}  # (binary, depth): the last Python run's walks
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "run.gpuscope"
        for _ in range(args.rounds):
            for depth in depths:
                for binary in args.gpuscope:
                    for with_python in (False, True):
                        run_ns, walked = bpf_ns(binary, out, args.python, args.cudart, depth, args.calls, with_python,
                                                args.nest)
                        ns.setdefault((binary, depth, with_python), []).append(run_ns)
                        if with_python:
                            walks[(binary, depth)] = walked
    print(f"BPF ns per launch probe run, median of {args.rounds} rounds ({args.calls} launches each); "
          f"Python frames = recursion depth + 2; recursion through {args.nest}")
    print(f"{'gpuscope':40} {'depth':>5} {'no Python':>10} {'Python':>8} {'walk':>6}")
    for binary in args.gpuscope:
        for depth in depths:
            off = statistics.median(ns[(binary, depth, False)])
            on = statistics.median(ns[(binary, depth, True)])
            print(f"{binary[-40:]:40} {depth:>5} {off:>10.0f} {on:>8.0f} {on - off:>6.0f}  {walks.get((binary, depth), '')}")


if __name__ == "__main__":
    main()
