/* A CPU-sampling target: 4 threads spin at the bottom of recursions 20 to 79 frames deep,
 * chosen at random each time, in code with frame pointers, for `seconds` (argv[1], default 10).
 * What gpuscope's own CPU costs per sample with walked stacks:
 *
 *     gpuscope record --cpu-profile 999 --sample-unwind fp --no-stacks -- build/bench/sample_stacks 60
 *
 * then `recorder_cpu_ns` in the record's meta table. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static double seconds;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static double spin(int depth) {
  volatile char frame[256];
  frame[0] = (char)depth;
  if (depth == 0) {
    double x = 0;
    for (int i = 0; i < 100000; i++) x += i * 0.5;
    return x;
  }
  return spin(depth - 1) + frame[0];
}

static void* worker(void* arg) {
  unsigned seed = (unsigned)(long)arg;
  double until = now() + seconds, x = 0;
  while (now() < until) x += spin(20 + rand_r(&seed) % 60);
  return (void*)(long)(x > 0);
}

int main(int argc, char** argv) {
  seconds = argc > 1 ? atof(argv[1]) : 10;
  pthread_t threads[4];
  for (long i = 0; i < 4; i++) pthread_create(&threads[i], 0, worker, (void*)i);
  for (int i = 0; i < 4; i++) pthread_join(threads[i], 0);
  return 0;
}
