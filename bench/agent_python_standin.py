#!/usr/bin/env python3
"""A stand-in for a PyTorch job's stacks where there is no GPU (the dev VM): two threads running
deep, varied Python stacks (20-34 frames through 40 functions), each leaf making 8
cudaMemsetAsync calls through the real libcudart (they fail without a driver and are probed all
the same) and some Python work. Under CPU sampling nearly every sample is a new stack, as beside
a training job, so the agent's stack naming is exercised as there.

    python3 bench/agent_python_standin.py SECONDS"""
import ctypes
import sys
import threading
import time

runtime = ctypes.CDLL("libcudart.so")
N = 40
# f{i} recurses d times through the others, then calls leaf().
SOURCE = "\n".join(f"def f{i}(d, k):\n    if d == 0:\n        return leaf(k)\n    return FUNCS[(k * 7 + d) % {N}](d - 1, k)\n"
                   for i in range(N))


def leaf(k):
    for _ in range(8):
        runtime.cudaMemsetAsync(None, 0, 0, None)
    s = 0
    for i in range(200 + k % 50):
        s += i * i
    return s


scope = {"leaf": leaf}
exec(SOURCE, scope)
FUNCS = scope["FUNCS"] = [scope[f"f{i}"] for i in range(N)]


def worker(seconds):
    end = time.time() + seconds
    k = 0
    while time.time() < end:
        FUNCS[k % N](20 + k % 15, k)
        k += 1


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
t = threading.Thread(target=worker, args=(seconds,))
t.start()
worker(seconds)
t.join()
