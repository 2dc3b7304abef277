// Copies from and to pageable memory in four patterns, for `gpuscope advise` (issue 35): one
// 16 MB buffer copied to the GPU 20 times (worth pinning once), 12 new 8 MB buffers copied once
// each (worth pinning where they are made), one 64 MB checkpoint copied back once (not worth
// registering), and a 4 KB buffer copied 200 times (pinned is no faster). Without a GPU the
// copies fail, but each call is made with its real arguments.
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

}  // namespace

int main() {
  void* dev = nullptr;
  const cudaError_t e = cudaMalloc(&dev, 64 * kMiB);
  std::printf("cudaMalloc: %s\n", cudaGetErrorString(e));
  reused_input(dev);
  fresh_batches(dev);
  checkpoint(dev);
  small_reads(dev);
  return 0;
}
