#!/usr/bin/env python3
"""A launch-bound Python loop that needs no GPU: kernel launches through the real libcudart,
made from a few levels of Python functions, as fast as Python makes them (each fails at once
without a device, but every one is a probe hit with a native and a Python stack). A stand-in
for an eager PyTorch loop where there is no GPU, e.g. to see the agent's budget hold:

    bench/agent_soak.py --seconds 60 -- python3 bench/py_launch_loop.py [LIBCUDART]"""
import ctypes
import sys

cudart = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libcudart.so.13")
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


while True:
    step()
