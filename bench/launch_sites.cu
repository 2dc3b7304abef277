// A CUDA program as most are built: plain `nvcc -O2` (the CUDA runtime linked in statically, gcc
// at -O2 keeping no frame pointers). Its launches come from two call sites, below two functions
// of its own; it allocates, copies both ways and frees. For bench/gpu/default_stacks.py: do
// record's default stacks reach main through code without frame pointers, and tell the two
// call sites apart?
//
//   launch_sites [LAUNCHES]   (default 1,007: 504 from the first site, 503 from the second)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void saxpy(float a, const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

namespace {
constexpr int kN = 1 << 16;

// The empty asm after each call keeps the calls from being folded or made tail calls.
__attribute__((noinline)) void launch_from_first_site(float* x, float* y, long count) {
  for (long i = 0; i < count; ++i) saxpy<<<kN / 256, 256>>>(2.0f, x, y, kN);
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void launch_from_second_site(float* x, float* y, long count) {
  for (long i = 0; i < count; ++i) saxpy<<<kN / 256, 256>>>(0.5f, y, x, kN);
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) int run(long launches) {
  std::vector<float> host(kN, 1.0f);
  float *x = nullptr, *y = nullptr;
  int failures = (cudaMalloc(&x, kN * sizeof(float)) != cudaSuccess) + (cudaMalloc(&y, kN * sizeof(float)) != cudaSuccess);
  failures += cudaMemcpy(x, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess;
  failures += cudaMemcpy(y, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess;
  launch_from_first_site(x, y, (launches + 1) / 2);
  launch_from_second_site(x, y, launches / 2);
  failures += cudaMemcpy(host.data(), y, kN * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess;
  failures += (cudaFree(x) != cudaSuccess) + (cudaFree(y) != cudaSuccess);
  asm volatile("" ::: "memory");
  return failures;
}
}  // namespace

int main(int argc, char** argv) {
  const long launches = argc > 1 ? atol(argv[1]) : 1007;
  const int failures = run(launches);
  printf("launch_sites: %ld launches, %d failed calls\n", launches, failures);
  return failures ? 1 : 0;
}
