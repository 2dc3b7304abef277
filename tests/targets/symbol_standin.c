// A stand-in CUDA runtime and driver for symbol copies whose calls succeed without a GPU. Its
// cudaMemcpyFromSymbol(dst, symbol, count, offset, cudaMemcpyDefault) makes what libcudart 13's
// made on the H100: a default-direction cuMemcpy from the symbol's device address, which no
// probed allocation made. On the symbol's first use it looks the address up with its
// cuLibraryGetGlobal (address and size written through two out-pointers), as libcudart does, or,
// with `lookup` 0, through a path no probe sees (a symbol the runtime resolved before gpuscope
// came). It defines cudaMalloc (what marks a static runtime), so gpuscope probes them all.
// Loaded late by load_lib.py, which calls run_symbol_copies(lookup, batches).
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kDefault = 4, kSymbolBytes = 4096 };

static char device_memory[kSymbolBytes];  // stands for the symbol's storage on the device
static char symbol_shadow[kSymbolBytes];  // the host shadow a program names the symbol by

__attribute__((noinline)) int cuLibraryGetGlobal(unsigned long long *dptr, size_t *bytes, void *library,
                                                 const char *name) {
  __asm__ volatile("" ::: "memory");  // not folded into its caller
  if (!dptr || !name) return 1;
  *dptr = (unsigned long long)device_memory;
  if (bytes) *bytes = sizeof(device_memory);
  return library ? 0 : 1;
}

__attribute__((noinline)) int cuMemcpy(unsigned long long dst, unsigned long long src, size_t bytes) {
  memcpy((void *)dst, (const void *)src, bytes);
  __asm__ volatile("" ::: "memory");
  return 0;
}

static unsigned long long resolved;  // the symbol's device address, once looked up
static int look_up;

// Not exported: what a runtime that found the symbol before the recording began does.
__attribute__((noinline)) static unsigned long long resolve_quietly(void) {
  __asm__ volatile("" ::: "memory");
  return (unsigned long long)device_memory;
}

__attribute__((noinline)) int cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                                   int kind) {
  if (symbol != symbol_shadow || offset + count > sizeof(device_memory)) return 13;  // cudaErrorInvalidSymbol
  if (kind != kDefault) return 21;  // this stand-in makes only what cudaMemcpyDefault made
  if (!resolved) {
    static char library;  // a CUlibrary handle
    size_t bytes = 0;
    if (!look_up)
      resolved = resolve_quietly();
    else if (cuLibraryGetGlobal(&resolved, &bytes, &library, "symbol_buf") || bytes < offset + count)
      return 500;  // CUDA_ERROR_NOT_FOUND
  }
  return cuMemcpy((unsigned long long)dst, resolved + offset, count);
}

int cudaMalloc(void **p, size_t n) {
  (void)n;
  *p = 0;
  return 2;
}

// `batches` batches of ten copies of 896 bytes from the symbol into pageable memory, 10 ms apart,
// each a cudaMemcpyFromSymbol with cudaMemcpyDefault (time enough for gpuscope to remove the
// runtime function's probes while it goes on, were it to find that the driver's stand for it);
// then, with `lookup`, the program's own cuMemcpy of 64 bytes from the address the lookup gave (a
// driver API program's copy from a module global).
int run_symbol_copies(int lookup, int batches) {
  look_up = lookup;
  char *host = malloc(896);
  int failures = 0;
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < 10; ++i) failures += cudaMemcpyFromSymbol(host, symbol_shadow, 896, 0, kDefault) != 0;
    usleep(10000);
  }
  if (lookup) failures += cuMemcpy((unsigned long long)host, resolved + 128, 64) != 0;
  free(host);
  return failures;
}
