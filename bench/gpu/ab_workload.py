#!/usr/bin/env python3
"""One of workloads.py's workloads, run until its standard input closes, for measurements taken
inside one process (attach_ab.py): tools are attached and detached while it runs, so that every
configuration is compared with the same process's own steps and not with another process's
(PyTorch processes differ from each other by more than gpuscope adds).

    python3 ab_workload.py WORKLOAD

Prints "step END_NS DURATION_NS MODE" after each step (CLOCK_MONOTONIC, the step synchronised).
Reads commands between steps: "profiler none|cuda|cuda+stack" leaves the current torch.profiler
window and enters one with CPU and CUDA activities (with Python stacks for cuda+stack), then answers
"mode NAME". "count N" runs N steps under torch.profiler (CPU and CUDA activities) at once, then
answers "count T0_NS T1_NS JSON": the steps' span and the profiler's kernel launches in them by
name (a reference for a tool recording the same steps). WORKLOAD ctypes_launch needs no GPU or PyTorch: launches through libcudart by ctypes
(each fails at once without a device), as bench/py_launch_loop.py makes them; it has no profiler."""
import collections
import ctypes
import json
import os
import pathlib
import tempfile
import queue
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent


def ctypes_launch():
    cudart = ctypes.CDLL("libcudart.so.13")
    launch = cudart.cudaLaunchKernel
    launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                       ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    grid = (1 << 32) | 1

    def layer(n):
        for _ in range(n):
            launch(0x1000, grid, 1, grid, 1, None, 0, None)

    def step():
        for _ in range(8):
            layer(16)
        return sum(i * i for i in range(2000))
    return step


def main():
    name = sys.argv[1]
    if name == "ctypes_launch":
        step = ctypes_launch()
        torch = None
    else:
        sys.path.insert(0, str(HERE))
        import torch  # noqa: F401  (workloads imports it too; here for the profiler)
        import workloads
        torch.manual_seed(0)
        step = workloads.WORKLOADS[name]()[0]
        for _ in range(3):
            step()  # allocator, cuBLAS handles, kernel loading

    commands = queue.Queue()

    def read_commands():
        for line in sys.stdin:
            commands.put(line.split())
        commands.put(None)
    threading.Thread(target=read_commands, daemon=True).start()

    profiler, mode = None, "none"
    out = sys.stdout
    while True:
        try:
            cmd = commands.get_nowait()
        except queue.Empty:
            cmd = []
        if cmd is None:
            break
        if cmd[:1] == ["profiler"]:
            if profiler is not None:
                profiler.__exit__(None, None, None)  # its post-processing runs here, outside any step
                profiler, mode = None, "none"
            if cmd[1] != "none" and torch is not None:
                from torch.profiler import ProfilerActivity, profile
                profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                   with_stack=cmd[1] == "cuda+stack")
                profiler.__enter__()
                mode = cmd[1]
            out.write(f"mode {mode}\n")
            out.flush()
        if cmd[:1] == ["count"] and torch is not None and profiler is None:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as counting:
                torch.cuda.synchronize()
                t0 = time.monotonic_ns()
                for _ in range(int(cmd[1])):
                    step()
                torch.cuda.synchronize()
                t1 = time.monotonic_ns()
            trace = os.path.join(tempfile.mkdtemp(), "trace.json")
            counting.export_chrome_trace(trace)
            with open(trace) as f:
                kernels = collections.Counter(e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel")
            os.unlink(trace)
            out.write(f"count {t0} {t1} {json.dumps(kernels)}\n")
            out.flush()
        t0 = time.monotonic_ns()
        step()
        t1 = time.monotonic_ns()
        out.write(f"step {t1} {t1 - t0} {mode}\n")
        out.flush()
    if profiler is not None:
        profiler.__exit__(None, None, None)


if __name__ == "__main__":
    main()
