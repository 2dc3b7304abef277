/* CPU profile target: spends about `seconds` (argv[1], default 1) in spin_in_user_space() and a
 * known share in a system call, so that samples can be checked against where time went. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) double spin_in_user_space(double until) {
  double x = 0;
  while (now() < until)
    for (int i = 0; i < 10000; ++i) x += i * 0.5;
  return x;
}

__attribute__((noinline)) void read_from_dev_zero(double until) {
  static char buf[1 << 16];
  int fd = open("/dev/zero", O_RDONLY);
  while (now() < until) read(fd, buf, sizeof buf);
  close(fd);
}

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? atof(argv[1]) : 1.0;
  const double start = now();
  double x = spin_in_user_space(start + seconds * 0.75);
  read_from_dev_zero(start + seconds);
  printf("busy_loop: %.0f\n", x > 0 ? 1.0 : 0.0);
  return 0;
}
