#!/usr/bin/env python3
"""CuPy kernels launched N times each: a RawKernel (compiled by NVRTC, launched through the
driver's cuLaunchKernel) and an ElementwiseKernel. Writes what it launched as JSON.
    python3 fw_cupy.py OUT.json [--launches N]"""
import json
import sys

import cupy as cp

SCALE = cp.RawKernel(r'''
extern "C" __global__ void gpuscope_scale(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}''', "gpuscope_scale")
AXPY = cp.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 z", "z = a * x + y", "gpuscope_axpy")


def main():
    out_path, n = sys.argv[1], int(sys.argv[sys.argv.index("--launches") + 1]) if "--launches" in sys.argv else 200
    size = 1 << 22
    x = cp.arange(size, dtype=cp.float32)
    y = cp.empty_like(x)
    for _ in range(n):
        SCALE(((size + 255) // 256,), (256,), (x, y, cp.float32(2), cp.int32(size)))  # the launch line
    for _ in range(n):
        z = AXPY(cp.float32(2), x, y)
    cp.cuda.Device().synchronize()
    assert float(z[3]) == 2 * 3 + 2 * 3
    json.dump({"framework": "cupy", "version": cp.__version__,
               "expected": {"gpuscope_scale": n, "gpuscope_axpy": n}, "launch_file": __file__,
               "launch_function": "main"}, open(out_path, "w"))


if __name__ == "__main__":
    main()
