// A CUDA program with a known set of API calls, for the runtime tests and the README example.
// Without a GPU every call fails ("driver insufficient"), but each is a real call into the
// real libcudart, so its probes fire with these exact arguments.
//
//   cuda_ops [--iterations N] [--threads T] [--sleep-ms MS] [--wait-file PATH] [--long-name 1]
// --long-name 1: also launches a kernel whose mangled name is longer than the call record's
// copy of a registration's name, so the name must be read from the process.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

__global__ void vecAdd(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

template <typename T>
__global__ void scale(T* x, T factor, int n) {
  extern __shared__ char smem[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}

namespace gpuscope_targets {
template <int Block>
__global__ void kernel_with_a_name_longer_than_the_copy_in_the_call_record(float* x, int n) {
  int i = blockIdx.x * Block + threadIdx.x;
  if (i < n) x[i] += 1;
}
}  // namespace gpuscope_targets

namespace {

constexpr size_t kMiB = 1 << 20;
bool long_name_kernel = false;

__attribute__((noinline)) void launch_kernels(float* a, float* b, float* c, cudaStream_t stream) {
  vecAdd<<<dim3(4, 2, 1), dim3(128, 1, 1)>>>(a, b, c, 1024);
  scale<float><<<dim3(8), dim3(64, 2), 256, stream>>>(c, 2.0f, 1024);
}

__attribute__((noinline)) void copy_data(float* dev, float* pinned, float* pageable) {
  cudaMemcpy(dev, pageable, kMiB, cudaMemcpyHostToDevice);
  cudaMemcpy(dev, pinned, kMiB, cudaMemcpyHostToDevice);
  cudaMemcpy(pageable, dev, 2 * kMiB, cudaMemcpyDeviceToHost);
  cudaMemcpyAsync(pinned, dev, 3 * kMiB, cudaMemcpyDeviceToHost, nullptr);
  cudaMemcpy(dev, dev, 4 * kMiB, cudaMemcpyDeviceToDevice);
}

void work(int iterations) {
  float *a = nullptr, *b = nullptr, *c = nullptr, *pinned = nullptr;
  cudaMalloc(&a, 1 * kMiB);
  cudaMalloc(&b, 2 * kMiB);
  cudaMalloc(&c, 4 * kMiB);
  cudaMallocHost(&pinned, 8 * kMiB);
  std::vector<float> pageable(kMiB);
  for (int i = 0; i < iterations; ++i) {
    copy_data(a, pinned, pageable.data());
    cudaMemset(c, 0, 4 * kMiB);
    launch_kernels(a, b, c, nullptr);
    if (long_name_kernel)
      gpuscope_targets::kernel_with_a_name_longer_than_the_copy_in_the_call_record<128><<<8, 128>>>(c, 1024);
    cudaStreamSynchronize(nullptr);
  }
  cudaDeviceSynchronize();
  cudaFree(a);
  cudaFree(b);  // c is leaked on purpose
  cudaFreeHost(pinned);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 1, threads = 1, sleep_ms = 0;
  const char* wait_file = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--iterations")) iterations = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--sleep-ms")) sleep_ms = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--wait-file")) wait_file = argv[i + 1];
    else if (!strcmp(argv[i], "--long-name")) long_name_kernel = atoi(argv[i + 1]) != 0;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  // --wait-file: poll until the file exists (a test attaches with --pid, then creates it).
  while (wait_file && !std::ifstream(wait_file).good()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, iterations);
  work(iterations);
  for (auto& t : pool) t.join();
  printf("cuda_ops: %d thread(s) x %d iteration(s) done\n", threads, iterations);
  return 3;  // a distinctive exit code: `record -- CMD` must pass it through
}
