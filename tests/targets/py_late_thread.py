"""A native thread calls CUDA, then Python (tests/targets/late_python_thread.c); the callback's
CUDA call must show the callback's frame, marked "# line: NAME".

usage: py_late_thread.py LIBCUDART LIBLATE_PYTHON_THREAD"""
import ctypes
import sys

cudart = ctypes.CDLL(sys.argv[1])
lib = ctypes.CDLL(sys.argv[2])


@ctypes.CFUNCTYPE(None)
def callback():
    ptr = ctypes.c_void_p()
    cudart.cudaMalloc(ctypes.byref(ptr), 4096)  # line: callback


print(f"py_late_thread: {lib.run_thread(sys.argv[1].encode(), callback)}")
