"""Kernel launches through the real libcudart as fast as ctypes makes them, N of them: each fails
at once without a device, but every one is a probe hit and a record.

    python3 launch_burst.py LIBCUDART N"""
import ctypes
import sys

cudart = ctypes.CDLL(sys.argv[1])
launch = cudart.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
grid = (1 << 32) | 1  # dim3 {1, 1} packed, z passed apart
for _ in range(int(sys.argv[2])):
    launch(0x1000, grid, 1, grid, 1, None, 0, None)
print("launch_burst: done")
