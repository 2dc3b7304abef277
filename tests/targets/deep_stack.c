/* Spins at the bottom of a recursion far deeper than the stack copy a CPU sample carries
 * (100 frames of ~600 bytes > 16 KiB), so that the unwinder must say the stack was cut. */
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) double recurse(int depth, double until) {
  volatile char frame[512];
  frame[0] = (char)depth;
  if (depth == 0) {
    double x = 0;
    while (now() < until) x += 1;
    return x + frame[0];
  }
  return recurse(depth - 1, until) + frame[0];
}

int main(void) {
  /* A first descent that returns at once faults the stack's pages in: a sample taken while the
   * measured descent waits on a page fault would hold a shallow stack that reaches main. */
  recurse(100, 0);
  printf("deep_stack: %d\n", recurse(100, now() + 0.5) > 0);
  return 0;
}
