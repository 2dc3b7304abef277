"""Calls CUDA through ctypes under a deep Python stack: NEST levels of recursion whose frames
fill several pages of the interpreter's data stack, a generator (its frame lives in the
generator object, not on that stack) and, every tenth level, a C call back into Python (map), as
nn.Module calls do: 3.12+ puts a shim frame on the C stack at each.

usage: py_deep.py LIBCUDART NEST"""
import ctypes
import sys

cudart = ctypes.CDLL(sys.argv[1])


def from_generator():
    ptr = ctypes.c_void_p()
    yield cudart.cudaMalloc(ctypes.byref(ptr), 1 << 20)  # line: malloc


def nest(depth, pad0=0, pad1=1, pad2=2, pad3=3):
    locals_that_widen_the_frame = [pad0, pad1, pad2, pad3] * 2
    if depth == 0:
        return next(from_generator())  # line: leaf
    if depth % 10 == 5:
        return list(map(nest, [depth - 1]))[0]  # line: through_c
    return nest(depth - 1, *locals_that_widen_the_frame[:4])  # line: nest


NEST = int(sys.argv[2])
nest(NEST)  # line: module
