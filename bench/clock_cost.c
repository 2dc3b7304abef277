/* What reading the time costs a thread on this machine: clock_gettime(CLOCK_MONOTONIC) (a vDSO
 * read where the clock source allows it, a system call where it does not), its coarse variant,
 * and rdtsc. The in-process launch hooks read the time twice a launch (issue 33).
 *   clock_cost [--calls N]
 * Prints one JSON line: the clock source and ns per read of each. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

static double ns_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
  long n = 1000000;
  if (argc > 2 && !strcmp(argv[1], "--calls")) n = atol(argv[2]);
  char source[64] = "unknown";
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (f) {
    if (fgets(source, sizeof source, f)) source[strcspn(source, "\n")] = 0;
    fclose(f);
  }
  struct timespec ts;
  volatile uint64_t sink = 0;
  double t0 = ns_now();
  for (long i = 0; i < n; ++i) {
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sink += (uint64_t)ts.tv_nsec;
  }
  const double mono = (ns_now() - t0) / n;
  t0 = ns_now();
  for (long i = 0; i < n; ++i) {
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    sink += (uint64_t)ts.tv_nsec;
  }
  const double coarse = (ns_now() - t0) / n;
  t0 = ns_now();
  for (long i = 0; i < n; ++i) sink += __rdtsc();
  const double tsc = (ns_now() - t0) / n;
  printf("{\"clocksource\": \"%s\", \"monotonic_ns\": %.1f, \"monotonic_coarse_ns\": %.1f, \"rdtsc_ns\": %.1f}\n", source,
         mono, coarse, tsc);
  return sink == 42;
}
