"""Loads libcudart late, through ctypes, and calls it at once: the first call must be recorded."""
import ctypes
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "libcudart.so.13"
cudart = ctypes.CDLL(path)
ptr = ctypes.c_void_p()
rc = cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(12345))
cudart.cudaFree(ptr)
print(f"late_dlopen: cudaMalloc returned {rc}")
