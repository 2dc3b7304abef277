"""Calls CUDA through ctypes from known Python functions: the stacks gpuscope records for
these calls must show them, innermost first, with the lines marked "# line: NAME".

usage: py_cuda.py LIBCUDART [LIBCUDA]   (with LIBCUDA, also launches through the driver API)"""
import ctypes
import os
import sys
import threading

cudart = ctypes.CDLL(sys.argv[1])
cuda = ctypes.CDLL(sys.argv[2]) if len(sys.argv) > 2 else None


def allocate(n):
    ptr = ctypes.c_void_p()
    return cudart.cudaMalloc(ctypes.byref(ptr), n)  # line: malloc


class Model:
    def step(self, i):
        return allocate((i + 1) << 20)  # line: step

    def launch(self):
        # A made-up function handle: the driver stub fails every call, but each is recorded.
        return cuda.cuLaunchKernel(ctypes.c_void_p(0x2000), 4, 1, 1, 32, 1, 1, 0, None, None, None)  # line: launch


def in_thread():
    cudart.cudaDeviceSynchronize()  # line: sync


def in_child():
    cudart.cudaFree(None)  # line: child


def main():
    m = Model()
    for i in range(3):
        m.step(i)  # line: main
    if cuda:
        for _ in range(2):
            m.launch()  # line: main_launch
    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    pid = os.fork()
    if pid == 0:
        in_child()  # line: fork
        os._exit(0)
    os.waitpid(pid, 0)


main()  # line: module
