"""Launches, allocations and copies from Python code layered as a framework's is: a model whose
layers are called through a C builtin (functools.reduce, as nn.Sequential goes through C++ and
back), from a callback that C code calls (libc's qsort calling a ctypes callback, as a C++
extension calls back into Python), down to the CUDA runtime through ctypes. Native frames of the
interpreter, libc, ctypes and libffi lie between the Python frames, as libtorch_python's and
python3.X's do in a PyTorch program. Then it spins in Python for the CPU profile.

Each launch's grid x says which layer launched it (1: Linear, 2: Activation).

usage: py_layers.py LIBCUDART [STEPS] [SPIN_SECONDS]"""
import ctypes
import functools
import sys
import time

cudart = ctypes.CDLL(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
spin_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
launch = cudart.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
libc = ctypes.CDLL(None)
COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def dim3(x):
    return (1 << 32) | x  # dim3 {x, 1} packed, z passed apart


class Layer:
    def __call__(self, x):
        return self.forward(x)  # line: call


class Linear(Layer):
    def forward(self, x):
        launch(0x1000, dim3(1), 1, dim3(32), 1, None, 0, None)  # line: linear
        return x


class Activation(Layer):
    def forward(self, x):
        launch(0x2000, dim3(2), 1, dim3(32), 1, None, 0, None)  # line: activation
        return x


class Sequential(Layer):
    def __init__(self, *layers):
        self.layers = layers

    def forward(self, x):
        return functools.reduce(lambda acc, layer: layer(acc), self.layers, x)  # line: reduce


def from_native(fn):
    """Calls fn from C: qsort calls the comparison back, once for two elements."""
    values = (ctypes.c_int * 2)(1, 0)
    out = []

    def compare(a, b):
        if not out:
            out.append(fn())  # line: callback
        return 0

    libc.qsort(values, 2, ctypes.sizeof(ctypes.c_int), COMPARE(compare))  # line: qsort
    return out[0]


def allocate(n):
    ptr = ctypes.c_void_p()
    cudart.cudaMalloc(ctypes.byref(ptr), n)  # line: malloc
    host = ctypes.create_string_buffer(n)
    cudart.cudaMemcpy(ptr, host, n, 1)  # line: memcpy
    return ptr


def spin(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:  # line: spin
        n += 1
    return n


def train_step(model):
    return from_native(lambda: model(0))  # line: step


def main():
    model = Sequential(Linear(), Activation(), Linear())
    from_native(lambda: allocate(1 << 20))  # line: allocate
    for _ in range(steps):
        train_step(model)  # line: main
    from_native(lambda: spin(spin_seconds))  # line: spin_call


main()  # line: module
