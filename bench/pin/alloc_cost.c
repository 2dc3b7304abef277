/* What serving large allocations costs a program that never copies (libgpuscope_pin.so's allocator
 * against the C library's): N rounds of malloc, touch every page, free, at sizes from 256 KiB to
 * 64 MiB, and small allocations that pass through. Prints ns per round.
 *   gcc -O2 -o alloc_cost bench/pin/alloc_cost.c
 *   ./alloc_cost; LD_PRELOAD=build/libgpuscope_pin.so ./alloc_cost */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
  const size_t sizes[] = {64, 4096, 256 << 10, 1 << 20, 16 << 20, 64 << 20};
  unsigned long sink = 0;
  for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    const size_t n = sizes[i];
    const int rounds = n <= 4096 ? 2000000 : n <= (1 << 20) ? 20000 : 400;
    const double t0 = now_ns();
    for (int r = 0; r < rounds; ++r) {
      unsigned char *p = malloc(n);
      for (size_t k = 0; k < n; k += 4096) p[k] = (unsigned char)r;
      sink += p[n / 2];
      free(p);
    }
    printf("%9zu B: %10.0f ns per malloc, touch, free\n", n, (now_ns() - t0) / rounds);
  }
  return (int)(sink & 1) * 0;
}
