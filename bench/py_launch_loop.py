#!/usr/bin/env python3
"""A launch-bound Python loop that needs no GPU: kernel launches through the real libcudart,
made from a few levels of Python functions, as fast as Python makes them (each fails at once
without a device, but every one is a probe hit with a native and a Python stack). A stand-in
for an eager PyTorch loop where there is no GPU, e.g. to see the agent's budget hold:

    bench/agent_soak.py --seconds 60 -- python3 bench/py_launch_loop.py [LIBCUDART]
    bench/agent_cost.py --budget-check --workload "python3 bench/py_launch_loop.py --seconds 20"
"""
import argparse
import ctypes
import json
import time

ap = argparse.ArgumentParser()
ap.add_argument("libcudart", nargs="?", default="libcudart.so.13")
ap.add_argument("--seconds", type=float, default=0, help="stop after this long and print µs per launch (0: run until killed)")
args = ap.parse_args()
cudart = ctypes.CDLL(args.libcudart)
launch = cudart.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
grid = (1 << 32) | 1  # dim3 {1, 1} packed, z passed apart


def layer(n):
    for _ in range(n):
        launch(0x1000, grid, 1, grid, 1, None, 0, None)


def step():
    for _ in range(8):
        layer(16)
    # Some Python work between launches, as a model's host code does.
    return sum(i * i for i in range(2000))


start, steps = time.monotonic(), 0
while not args.seconds or time.monotonic() - start < args.seconds:
    step()
    steps += 1
elapsed = time.monotonic() - start
print(json.dumps({"us_per_op": elapsed * 1e6 / (steps * 8 * 16), "launches": steps * 8 * 16}))
