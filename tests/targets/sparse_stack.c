/* Calls cudaMemcpy (host to host, 64 bytes: recorded with its bytes with or without a GPU) from under a frame whose locals span pages the thread never touches
 * (built without stack-clash probes, as a big frame's unused buffer leaves them): a copy of the
 * stack taken at the call cannot read those pages, yet the frames around them are whole.
 *
 * usage: sparse_stack LIBCUDART [SLEEP_MS]   (SLEEP_MS: stay alive that long after the call) */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*memcpy_fn)(void*, const void*, size_t, int);

__attribute__((noinline)) static int copy(memcpy_fn cuda_memcpy) {
  static char src[64], dst[64];
  return cuda_memcpy(dst, src, sizeof(src), 0 /* cudaMemcpyHostToHost */);
}

/* 12 KiB of locals of which only the lowest bytes are written: two or three whole pages
 * between copy's frame and this frame's return address stay unmapped. */
__attribute__((noinline)) static int under_sparse_frame(memcpy_fn cuda_memcpy) {
  char unused[3 * 4096];
  __asm__ volatile("" : : "r"(unused) : "memory");
  return copy(cuda_memcpy);
}

static void* worker(void* fn) {
  return (void*)(long)under_sparse_frame((memcpy_fn)fn);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: sparse_stack LIBCUDART [SLEEP_MS]\n");
    return 2;
  }
  void* cudart = dlopen(argv[1], RTLD_NOW);
  memcpy_fn cuda_memcpy = cudart ? (memcpy_fn)dlsym(cudart, "cudaMemcpy") : NULL;
  if (!cuda_memcpy) {
    fprintf(stderr, "sparse_stack: %s\n", dlerror());
    return 1;
  }
  pthread_t t;
  void* rc = NULL;
  if (pthread_create(&t, NULL, worker, (void*)cuda_memcpy) || pthread_join(t, &rc)) return 1;
  printf("sparse_stack: cudaMemcpy returned %ld\n", (long)rc);
  fflush(stdout);
  if (argc > 2) {
    const long ms = atol(argv[2]);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  return 0;
}
