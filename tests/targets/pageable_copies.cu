// Copies from and to pageable memory in five patterns, for `gpuscope advise` (issue 35): one
// 16 MB buffer copied to the GPU 20 times (worth pinning once), 12 new 8 MB buffers copied once
// each (worth pinning where they are made), one 64 MB checkpoint copied back once (not worth
// registering), a 4 KB buffer copied 200 times (pinned is no faster), and 12 more new 8 MB
// buffers, each freed after its copy, which the C library serves from its heap at one address.
// Without a GPU the copies fail, but each call is made with its real arguments.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kMiB = 1 << 20;

__attribute__((noinline)) void reused_input(void* dev) {
  std::vector<char> input(16 * kMiB, 1);
  for (int i = 0; i < 20; ++i) cudaMemcpy(dev, input.data(), input.size(), cudaMemcpyHostToDevice);
}

__attribute__((noinline)) void fresh_batches(void* dev) {
  std::vector<std::vector<char>> batches;  // kept alive: each at its own address
  for (int i = 0; i < 12; ++i) {
    batches.emplace_back(8 * kMiB, char(i));
    cudaMemcpy(dev, batches.back().data(), batches.back().size(), cudaMemcpyHostToDevice);
  }
}

__attribute__((noinline)) void checkpoint(void* dev) {
  std::vector<char> state(64 * kMiB);
  cudaMemcpy(state.data(), dev, state.size(), cudaMemcpyDeviceToHost);
}

__attribute__((noinline)) void small_reads(void* dev) {
  static char flag[4096];
  for (int i = 0; i < 200; ++i) cudaMemcpy(flag, dev, sizeof flag, cudaMemcpyDeviceToHost);
}

// Once the C library has freed a mapped block of 16 MB, it serves blocks up to that size from
// its heap (no mmap): each batch freed, the next one gets the same address.
__attribute__((noinline)) void heap_batches(void* dev) {
  void* volatile raise = malloc(16 * kMiB);
  free(raise);
  for (int i = 0; i < 12; ++i) {
    char* batch = static_cast<char*>(malloc(8 * kMiB));
    memset(batch, i, 8 * kMiB);
    cudaMemcpy(dev, batch, 8 * kMiB, cudaMemcpyHostToDevice);
    free(batch);
  }
}

}  // namespace

int main() {
  void* dev = nullptr;
  const cudaError_t e = cudaMalloc(&dev, 64 * kMiB);
  std::printf("cudaMalloc: %s\n", cudaGetErrorString(e));
  reused_input(dev);
  fresh_batches(dev);
  checkpoint(dev);
  small_reads(dev);
  heap_batches(dev);
  return 0;
}
