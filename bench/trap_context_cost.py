#!/usr/bin/env python3
"""What one uprobe trap (an empty BPF program on cudaLaunchKernel) adds per call in two callers:
the C launch loop the per-call floor is measured in (bench/uprobe_cost.py), and a Python loop
calling the same function through ctypes, which has the working set of an interpreter; with
--maps N also a Python process with N more memory mappings. Rounds interleaved; medians and
spreads. Needs root and libcudart; no GPU (the launches fail at once, but each is a trap).

    sudo bench/trap_context_cost.py [--build build] [--rounds 5] [--maps 20000]"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from uprobe_cost import ROOT, EmptyProbe, cudart_of  # noqa: E402

# A tight ctypes loop; argv: libcudart, calls, extra mappings (alternate protections keep the
# kernel from merging them).
PY_LOOP = r'''
import ctypes, json, sys, time
cudart_path, n, maps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if maps:
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = libc.mmap(None, 4096 * maps, 3, 0x22, -1, 0)
    for i in range(0, maps, 2):
        libc.mprotect(base + 4096 * i, 4096, 1)
launch = ctypes.CDLL(cudart_path).cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
grid = (1 << 32) | 1
# A host function that is no kernel, as the C loop's: the runtime fails the launch without a GPU
# and with one (a made-up address crashed it there).
not_a_kernel = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
t0 = time.perf_counter()
for _ in range(n):
    launch(not_a_kernel, grid, 1, grid, 1, None, 0, None)
print(json.dumps({"ns_per_call": (time.perf_counter() - t0) * 1e9 / n}))
'''


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])["ns_per_call"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--maps", type=int, default=20000, help="extra mappings of the third caller (0: leave it out)")
    args = ap.parse_args()
    build = pathlib.Path(args.build)
    try:
        cudart = cudart_of(build / "bench" / "launch_loop")
    except RuntimeError as e:
        raise SystemExit(str(e))
    callers = {"C launch loop": [str(build / "bench" / "launch_loop"), "--calls", str(args.calls)],
               "Python ctypes loop": [sys.executable, "-c", PY_LOOP, cudart, str(args.calls), "0"]}
    if args.maps:
        callers[f"Python, {args.maps} more mappings"] = [sys.executable, "-c", PY_LOOP, cudart, str(args.calls),
                                                         str(args.maps)]
    ns = {(c, p): [] for c in callers for p in (False, True)}
    for _ in range(args.rounds):
        for probed in (False, True):
            try:
                probe = EmptyProbe(build, {cudart: ["cudaLaunchKernel"]}) if probed else None
            except RuntimeError as e:
                raise SystemExit(f"{e} (run as root)")
            try:
                for name, cmd in callers.items():
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                    ns[(name, probed)].append(last_json(out))
            finally:
                if probe:
                    probe.close()
    print(f"ns per cudaLaunchKernel call, {args.calls} calls x {args.rounds} rounds (median, min..max)")
    print(f"{'caller':34} {'alone':>16} {'empty probe':>20} {'added by the trap':>18}")
    for name in callers:
        a, p = ns[(name, False)], ns[(name, True)]
        print(f"{name:34} {statistics.median(a):7.0f} ({min(a):.0f}..{max(a):.0f}) {statistics.median(p):9.0f} "
              f"({min(p):.0f}..{max(p):.0f}) {statistics.median(p) - statistics.median(a):12.0f}")


if __name__ == "__main__":
    sys.exit(main())
