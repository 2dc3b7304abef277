// malloc and free in a loop: what the heap hooks of libgpuscope_launches.so add to a program's
// allocations (bench/heap_hooks_cost.py). Touches one byte of each block. Prints ns a round.
//   malloc_loop ROUNDS BYTES
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  const long rounds = argc > 1 ? atol(argv[1]) : 1000000;
  const size_t bytes = argc > 2 ? strtoul(argv[2], NULL, 0) : 64;
  // One block of the size freed first: the C library serves the rest from its heap, as a
  // program's steady state does.
  char* volatile warm = malloc(bytes);
  free(warm);
  const double t0 = now_ns();
  for (long i = 0; i < rounds; ++i) {
    char* volatile p = malloc(bytes);
    p[0] = 1;
    free(p);
  }
  printf("%.1f ns a round\n", (now_ns() - t0) / (double)rounds);
  return 0;
}
