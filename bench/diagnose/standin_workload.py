#!/usr/bin/env python3
"""A stand-in for workload.py where there is no GPU or PyTorch (the dev VM): a Python loop whose
step is 4 ms of work and 30 `cudaMemsetAsync` calls through the real libcudart (they fail without
a driver, and are probed all the same). Takes workload.py's options, so that run.py can drive it:

    GPUSCOPE_DIAG_WORKLOAD=bench/diagnose/standin_workload.py python3 bench/diagnose/run.py --paired ...

For checking the benchmark's machinery and gpuscope's cost per probe hit on a CPU, not for
figures about GPU workloads."""
import argparse
import array
import ctypes
import os
import time

ap = argparse.ArgumentParser()
for k in ("--workload", "--fault", "--dir", "--ready", "--series"):
    ap.add_argument(k, default="")
ap.add_argument("--seconds", type=float, default=8)
ap.add_argument("--intensity", type=int, default=1)
a = ap.parse_args()
runtime = ctypes.CDLL("libcudart.so")


def step():
    for _ in range(30):
        runtime.cudaMemsetAsync(None, 0, 0, None)
    t = time.perf_counter() + 0.004
    while time.perf_counter() < t:
        pass


for _ in range(50):
    step()
if a.ready:
    with open(a.ready + ".tmp", "w") as f:
        f.write(f"{time.monotonic():.6f}\n")
    os.rename(a.ready + ".tmp", a.ready)
ends = array.array("d")
steps = 0
t0 = time.perf_counter()
while time.perf_counter() < t0 + a.seconds:
    step()
    steps += 1
    ends.append(time.monotonic())
if a.series:
    with open(a.series, "wb") as f:
        ends.tofile(f)
print(f"workload standin fault none/1: {steps} steps, {(time.perf_counter() - t0) / steps * 1e3:.2f} ms a step",
      flush=True)
