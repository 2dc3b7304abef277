"""Copies from Python buffers through the CUDA runtime (ctypes): `advise` must name the Python
lines that allocated them, marked "# line: NAME", apart from the line that copies.

usage: py_pageable.py LIBCUDART"""
import ctypes
import sys

cudart = ctypes.CDLL(sys.argv[1])
MiB = 1 << 20


def copy_in(dev, buf):
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    cudart.cudaMemcpy(dev, ctypes.c_void_p(address), ctypes.c_size_t(len(buf)), 1)  # line: copy


def make_input():
    return bytearray(48 * MiB)  # line: input


def make_checkpoint():
    return bytearray(40 * MiB)  # line: checkpoint


def main():
    dev = ctypes.c_void_p()
    cudart.cudaMalloc(ctypes.byref(dev), 64 * MiB)
    data = make_input()
    for _ in range(20):
        copy_in(dev, data)
    state = make_checkpoint()
    copy_in(dev, state)
    print("done")


main()
