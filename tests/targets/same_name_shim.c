// A library that wraps a CUDA function under the function's own name and calls the real one,
// as XLA's and Triton's driver shims do: gpuscope probes both (the library defines CUDA
// functions), so each call enters the same function twice, nested. Loaded late by
// load_lib.py, which calls run_static(); SHIM_CUDART names the libcudart to forward to.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

typedef int (*malloc_fn)(void **, size_t);
static malloc_fn real;

// The runtime is loaded with the shim, not inside its first call (which would make that
// call's two entries as far apart as gpuscope's probing of the runtime takes).
__attribute__((constructor)) static void load_runtime(void) {
  void *cudart = dlopen(getenv("SHIM_CUDART"), RTLD_NOW | RTLD_LOCAL);
  real = cudart ? (malloc_fn)dlsym(cudart, "cudaMalloc") : NULL;
}

int cudaMalloc(void **ptr, size_t size) { return real ? real(ptr, size) : -1; }

int run_static(void) {
  int failures = 0;
  for (int i = 0; i < 3; ++i) {
    void *p = NULL;
    failures += cudaMalloc(&p, 4242) != 0;
  }
  return failures;
}
