// Large heap blocks allocated, touched and freed in a loop, on several threads: the heap hooks'
// rate limit and table of live blocks (src/inject/heap_hooks.cpp), and the program's allocator
// left as it was. Each thread allocates ROUNDS blocks of BYTES with malloc, calloc, realloc,
// posix_memalign and aligned_alloc in turn, checks each block's contents, and frees it; prints
// one JSON line: the blocks allocated and any wrong byte.
//   heap_churn ROUNDS BYTES THREADS
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long g_rounds;
static size_t g_bytes;

static void* churn(void* arg) {
  long wrong = 0;
  const unsigned char fill = (unsigned char)(uintptr_t)arg;
  for (long i = 0; i < g_rounds; ++i) {
    unsigned char* p = NULL;
    switch (i % 5) {
      case 0: p = malloc(g_bytes); break;
      case 1: p = calloc(1, g_bytes); break;
      case 2: p = realloc(malloc(g_bytes / 2), g_bytes); break;
      case 3: if (posix_memalign((void**)&p, 64, g_bytes) != 0) p = NULL; break;
      case 4: p = aligned_alloc(4096, g_bytes); break;
    }
    if (!p) return (void*)-1L;
    if (i % 5 == 1 && p[g_bytes - 1] != 0) ++wrong;  // calloc's zeros
    memset(p, fill, g_bytes);
    if (p[0] != fill || p[g_bytes / 2] != fill || p[g_bytes - 1] != fill) ++wrong;
    free(p);
  }
  return (void*)wrong;
}

int main(int argc, char** argv) {
  g_rounds = argc > 1 ? atol(argv[1]) : 1000;
  g_bytes = argc > 2 ? strtoul(argv[2], NULL, 0) : (1 << 20);
  const int threads = argc > 3 ? atoi(argv[3]) : 1;
  pthread_t t[64];
  long wrong = 0, failed = 0;
  for (int i = 0; i < threads && i < 64; ++i) pthread_create(&t[i], NULL, churn, (void*)(uintptr_t)(i + 1));
  for (int i = 0; i < threads && i < 64; ++i) {
    void* r;
    pthread_join(t[i], &r);
    if ((long)r < 0)
      ++failed;
    else
      wrong += (long)r;
  }
  printf("{\"blocks\": %ld, \"wrong\": %ld, \"failed\": %ld}\n", g_rounds * threads, wrong, failed);
  return failed || wrong;
}
