"""Calls a stand-in autograd engine (tests/targets/autograd_standin.cpp, built as
libtorch_cpu.so) as loss.backward() calls PyTorch's: its worker thread launches kernels while
this thread waits. Their stacks must end, through the engine's call, in the Python lines marked
"# line: NAME".

usage: py_backward.py LIBCUDART LIBTORCH_CPU [--by-name]   (--by-name: the worker's work runs
outside Engine::thread_main: only its thread's name says whose it is)"""
import ctypes
import sys

cudart = ctypes.CDLL(sys.argv[1])
engine = ctypes.CDLL(sys.argv[2])


def backward():
    return engine.run_backward(sys.argv[1].encode(), 3, "--by-name" in sys.argv)  # line: backward


def train_step():
    ptr = ctypes.c_void_p()
    cudart.cudaMalloc(ctypes.byref(ptr), 4096)  # line: own_call
    return backward()  # line: step


print(f"py_backward: {train_step()} launches failed")  # line: module
