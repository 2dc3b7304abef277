// A library that stands in for a CUDA runtime whose calls reach other calls of its own through
// their exported names, as libcudart's cudaMemcpyArrayToArray does on a GPU (CUPTI sees an AtoD
// and a DtoA copy): it stages the copy through device memory with cudaMemcpyFromArray and
// cudaMemcpyToArray, each of which makes its driver copy (cuMemcpyAtoD_v2, cuMemcpyDtoA_v2).
// It defines cudaMalloc (what marks a static runtime), so gpuscope probes them all; the inner calls
// are the program's one copy, not copies of their own. Its cudaMemcpy2DArrayToArray makes two
// driver copies directly. Loaded late by load_lib.py, which calls run_array_copies(batches) or
// run_two_driver_copies(batches).
#include <stddef.h>
#include <unistd.h>

enum { kDeviceToDevice = 3 };

__attribute__((noinline)) int cuMemcpyAtoD_v2(unsigned long long dst, void *src_array, size_t src_offset,
                                              size_t bytes) {
  __asm__ volatile("" ::: "memory");  // not folded into its caller
  return dst && src_array && bytes && !src_offset ? 0 : 1;
}

__attribute__((noinline)) int cuMemcpyDtoA_v2(void *dst_array, size_t dst_offset, unsigned long long src,
                                              size_t bytes) {
  __asm__ volatile("" ::: "memory");
  return dst_array && src && bytes && !dst_offset ? 0 : 1;
}

__attribute__((noinline)) int cudaMemcpyFromArray(void *dst, const void *src, size_t w_offset, size_t h_offset,
                                                  size_t count, int kind) {
  if (kind != kDeviceToDevice) return 21;  // cudaErrorInvalidMemcpyDirection: this stand-in stages only
  return cuMemcpyAtoD_v2((unsigned long long)dst, (void *)src, w_offset + h_offset, count);
}

__attribute__((noinline)) int cudaMemcpyToArray(void *dst, size_t w_offset, size_t h_offset, const void *src,
                                                size_t count, int kind) {
  if (kind != kDeviceToDevice) return 21;
  return cuMemcpyDtoA_v2(dst, w_offset + h_offset, (unsigned long long)src, count);
}

// Eight arguments: the count and the kind are on the stack.
__attribute__((noinline)) int cudaMemcpyArrayToArray(void *dst, size_t w_dst, size_t h_dst, const void *src,
                                                     size_t w_src, size_t h_src, size_t count, int kind) {
  static char staging[1 << 16];  // device memory the runtime keeps for staging
  if (count > sizeof(staging)) return 2;
  int err = cudaMemcpyFromArray(staging, src, w_src, h_src, count, kDeviceToDevice);
  if (err) return err;
  return kind == kDeviceToDevice ? cudaMemcpyToArray(dst, w_dst, h_dst, staging, count, kDeviceToDevice) : 21;
}

// A runtime copy made of two driver copies directly, as another runtime might stage one: no
// single driver call stands for it.
__attribute__((noinline)) int cudaMemcpy2DArrayToArray(void *dst, size_t w_dst, size_t h_dst, const void *src,
                                                       size_t w_src, size_t h_src, size_t width, size_t height,
                                                       int kind) {
  static char staging[1 << 16];
  const size_t count = width * height;
  if (count > sizeof(staging) || kind != kDeviceToDevice) return 21;
  int err = cuMemcpyAtoD_v2((unsigned long long)staging, (void *)src, w_src + h_src, count);
  return err ? err : cuMemcpyDtoA_v2(dst, w_dst + h_dst, (unsigned long long)staging, count);
}

int cudaMalloc(void **p, size_t n) {
  (void)n;
  *p = 0;
  return 2;
}

static char array_a, array_b;  // array handles

__attribute__((noinline)) static int copy_batch(size_t bytes) {
  int failures = 0;
  for (int i = 0; i < 10; ++i) failures += cudaMemcpyArrayToArray(&array_b, 0, 0, &array_a, 0, 0, bytes, kDeviceToDevice);
  return failures;
}

// Batches of ten 1,280-byte array-to-array copies 10 ms apart: long enough for gpuscope to find
// that the inner functions add nothing to their driver copies (and remove their probes) while it goes on.
int run_array_copies(int batches) {
  int failures = 0;
  for (int b = 0; b < batches; ++b) {
    failures += copy_batch(1280);
    usleep(10000);
  }
  return failures;
}

// `batches` batches of ten 2-D array-to-array copies of 16 x 40 bytes, 50 ms apart: time enough
// for gpuscope to remove its probes, were it to find that the driver's could stand for it.
int run_two_driver_copies(int batches) {
  int failures = 0;
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < 10; ++i)
      failures += cudaMemcpy2DArrayToArray(&array_b, 0, 0, &array_a, 0, 0, 16, 40, kDeviceToDevice);
    usleep(50000);
  }
  return failures;
}
