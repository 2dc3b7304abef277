// A program that maps, touches and unmaps anonymous memory in a loop: what recording host
// allocations (bpf/host_allocs.bpf.c) adds to each mmap and munmap. Prints ns a round.
//   mmap_loop ROUNDS BYTES
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  const long rounds = argc > 1 ? atol(argv[1]) : 20000;
  const size_t bytes = argc > 2 ? strtoul(argv[2], NULL, 0) : 1 << 20;
  const double t0 = now_ns();
  for (long i = 0; i < rounds; ++i) {
    char* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    p[0] = 1;  // one page touched: the mapping's cost, not the pages'
    munmap(p, bytes);
  }
  printf("%.0f ns a round\n", (now_ns() - t0) / (double)rounds);
  return 0;
}
