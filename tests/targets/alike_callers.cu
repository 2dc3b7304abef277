// Launches through two callers whose frames are alike, at three depths of recursion, built
// without frame pointers: from one launch to the next the CUDA call's own frames lie at the
// same stack addresses with the same registers, but the chain above them differs. A stack walk
// that reuses the thread's last walk (bpf/gpuscope.bpf.c: walk_cache) must still tell them apart.
//
//   alike_callers [N] [SLEEP_MS]   (N launches, N / 6 through each caller at each depth, after
//                                   sleeping SLEEP_MS: time for gpuscope's stack walker to load)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

__global__ void tick(int* x) {
  if (x) x[threadIdx.x] += 1;
}

// The empty asm after each call keeps it from being a tail call, so that every frame stays.
namespace {
__attribute__((noinline)) void launch(int* x) {
  tick<<<1, 32>>>(x);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void via_left(int* x) {
  launch(x);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void via_right(int* x) {
  launch(x);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void nest(void (*via)(int*), int depth, int* x) {
  if (depth > 0)
    nest(via, depth - 1, x);
  else
    via(x);
  asm volatile("" ::: "memory");
}
}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 60;
  std::this_thread::sleep_for(std::chrono::milliseconds(argc > 2 ? atoi(argv[2]) : 0));
  // Launches two apart alternate callers at one depth: the second finds the first one's frames.
  for (int i = 0; i < n; ++i) nest(i % 2 ? via_right : via_left, (i / 2) % 3, nullptr);
  printf("alike_callers: %d launches\n", n);
  return 0;
}
