// Exactly N launches of one kernel, then exit: a process whose true launch count is known, for
// checking what the agent exports for it (its counters, exact or estimated).
//
//   launch_count N [--over SECONDS] [--after MS]
// --over: spread the launches evenly over that long (a steady rate; default: as fast as it can).
// --after: wait that long before the first launch, as a program does on a machine with a GPU
// while CUDA initialises (0.1-1 s there; here, without a driver, it fails at once).
// Prints "launch_count: N launches" at the end. Without a GPU every launch fails, but each is a
// real call into the real libcudart, so its probes fire.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace gpuscope_targets {
__global__ void counted_saxpy(float a, const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
}  // namespace gpuscope_targets

int main(int argc, char** argv) {
  const long n = argc > 1 ? atol(argv[1]) : 1007;
  double seconds = 0, after_ms = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--over")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--after")) after_ms = atof(argv[i + 1]);
  }
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(after_ms));
  // Where a GPU is, the kernel has memory to work on (here the allocations fail: null).
  float *x = nullptr, *y = nullptr;
  cudaMalloc(&x, 1024 * sizeof(float));
  cudaMalloc(&y, 1024 * sizeof(float));
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    if (seconds > 0)  // launch i is due at i / n of the span
      std::this_thread::sleep_until(start + std::chrono::duration<double>(seconds * double(i) / double(n)));
    gpuscope_targets::counted_saxpy<<<4, 256>>>(2.0f, x, y, 1024);
  }
  cudaDeviceSynchronize();
  cudaFree(x);
  cudaFree(y);
  printf("launch_count: %ld launches\n", n);
  return 0;
}
