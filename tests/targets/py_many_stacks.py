"""Launches from more distinct Python stacks than gpuscope holds at once: FUNCTIONS functions,
each launching at every recursion depth below DEPTHS. The launch's grid says which function
(grid x = i + 1) and its block which depth (block x = depth + 1), so a test can check that each
launch's recorded stack has those frames.

All of it twice: the second round's stacks are the first's again. PAUSE seconds after each
depth's launches (default 0.02) leave a recorder that lags behind (a loaded machine) time to
catch up, so that it drops its older stacks more than once in a run.

usage: py_many_stacks.py LIBCUDART [FUNCTIONS] [DEPTHS] [PAUSE]"""
import ctypes
import sys
import time

cudart = ctypes.CDLL(sys.argv[1])
functions = int(sys.argv[2]) if len(sys.argv) > 2 else 300
depths = int(sys.argv[3]) if len(sys.argv) > 3 else 30
pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.02
launch = cudart.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

# Each function its own code object: f{i}(d) recurses d times, then launches.
source = "".join(f"def f{i}(d):\n    if d:\n        return f{i}(d - 1)\n    return go({i})\n" for i in range(functions))


def go(i):
    return launch(0x1000, (1 << 32) | (i + 1), 1, (1 << 32) | (go.depth + 1), 1, None, 0, None)


namespace = {"go": go}
exec(compile(source, "many_stacks", "exec"), namespace)
for _ in range(2):
    for depth in range(depths):
        go.depth = depth
        for i in range(functions):
            namespace[f"f{i}"](depth)
        time.sleep(pause)
