// A shared library with the CUDA runtime linked into it statically (nvcc -cudart static -shared),
// loaded late by Python through ctypes: gpuscope must find the runtime inside it and probe it
// before its first call.
#include <cuda_runtime.h>

__global__ void lib_kernel(int* out) { out[threadIdx.x] = threadIdx.x; }

extern "C" int run_static(void) {
  int* out = nullptr;
  cudaError_t rc = cudaMalloc(&out, 7777);
  lib_kernel<<<3, 32>>>(out);
  cudaFree(out);
  return static_cast<int>(rc);
}
