// Two processes pass a byte back and forth through two pipes ROUNDS times, both pinned to one CPU,
// so that every pass is a context switch: prints the switches a second (two per round).
//   sched_pingpong ROUNDS [CPU]
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 200000;
  int cpu = argc > 2 ? atoi(argv[2]) : 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
  int ab[2], ba[2];
  if (pipe(ab) || pipe(ba)) return 1;
  char c = 0;
  pid_t child = fork();
  if (child == 0) {
    for (long i = 0; i < rounds; i++)
      if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) _exit(1);
    _exit(0);
  }
  double t0 = now();
  for (long i = 0; i < rounds; i++)
    if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
  double dt = now() - t0;
  waitpid(child, NULL, 0);
  printf("%.0f switches/s (%ld rounds in %.3f s, %.0f ns a switch)\n", 2 * rounds / dt, rounds, dt, dt / (2 * rounds) * 1e9);
  return 0;
}
