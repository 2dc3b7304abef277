// A library that stands in for a CUDA runtime whose calls reach the driver: its cudaMalloc and
// cudaMemsetAsync call its cuMemAlloc_v2 and cuMemsetD8Async, as libcudart's call libcuda's. It
// defines CUDA functions (cudaMalloc marks a static runtime), so gpuscope probes all four; the
// driver calls, made inside the runtime calls, take no stack of their own and get the runtime
// call's. Loaded late by load_lib.py, which calls run_static(), run_memsets(batches),
// run_lookups(launches) or run_runtime_launches(launches).
#include <stddef.h>
#include <unistd.h>

__attribute__((noinline)) int cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t n, void *stream) {
  __asm__ volatile("" ::: "memory");  // not folded into its caller
  return dst && n && !stream && value == 7 ? 0 : 1;
}

__attribute__((noinline)) int cudaMemsetAsync(void *dst, int value, size_t n, void *stream) {
  if (!n) return 1;  // refused before the driver, as the runtime refuses bad arguments
  return cuMemsetD8Async((unsigned long long)dst, (unsigned char)value, n, stream);
}

__attribute__((noinline)) int cuMemAlloc_v2(unsigned long long *dptr, size_t size) {
  static char arena[1 << 16];
  __asm__ volatile("" ::: "memory");
  *dptr = (unsigned long long)arena;
  return size <= sizeof(arena) ? 0 : 2;
}

__attribute__((noinline)) int cudaMalloc(void **ptr, size_t size) {
  unsigned long long p = 0;
  int err = cuMemAlloc_v2(&p, size);
  *ptr = (void *)p;
  return err;
}

__attribute__((noinline)) static int clear_buffers(char *buf) {
  int failures = 0;
  for (int i = 0; i < 5; ++i) failures += cudaMemsetAsync(buf, 7, 4096, NULL);
  return failures;
}

int run_static(void) {
  void *buf = 0;
  return cudaMalloc(&buf, 4096) + clear_buffers(buf);
}

__attribute__((noinline)) static int memset_batch(char *buf) {
  int failures = 0;
  for (int i = 0; i < 10; ++i) failures += cudaMemsetAsync(buf, 7, 4096, NULL);
  return failures;
}

// Batches of ten memsets 10 ms apart: they go on after gpuscope has seen enough of them to
// find that cudaMemsetAsync adds nothing to its cuMemsetD8Async, and removed its probes.
int run_memsets(int batches) {
  static char buf[4096];
  int failures = 0;
  for (int b = 0; b < batches; ++b) {
    failures += memset_batch(buf);
    usleep(10000);
  }
  return failures;
}

// One memset the runtime refuses without calling the driver, then run_memsets(batches): that
// one call keeps cudaMemsetAsync's probes. Returns the failures less the refusal.
int run_refused_memset(int batches) {
  static char buf[4096];
  return cudaMemsetAsync(buf, 7, 0, NULL) - 1 + run_memsets(batches);
}

// The driver's kernel lookups and launches as cuBLASLt makes them: a kernel is found in a library
// once (cuLibraryGetKernel), then before each launch its function is asked for
// (cuKernelGetFunction) and launched (cuLaunchKernel). The handles are made up but distinct.
__attribute__((noinline)) int cuLibraryGetKernel(void **kernel, void *library, const char *name) {
  __asm__ volatile("" ::: "memory");
  *kernel = (void *)(0x10000ul + (unsigned long)(unsigned char)name[7]);  // "kernel_a" -> 0x10061
  return library ? 0 : 1;
}

__attribute__((noinline)) int cuKernelGetFunction(void **function, void *kernel) {
  __asm__ volatile("" ::: "memory");
  *function = (void *)((unsigned long)kernel + 0x1000);
  return 0;
}

__attribute__((noinline)) int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                             unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
  __asm__ volatile("" ::: "memory");
  return f && gx && gy && gz && bx && by && bz && !shmem && !stream && !params && !extra ? 0 : 1;
}

__attribute__((noinline)) static int launch(void *kernel) {
  void *f = 0;
  int err = cuKernelGetFunction(&f, kernel);
  return err + cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0);
}

// `launches` launches, of kernel_a and kernel_b in turn, except that every tenth is kernel_a's
// with a memset between its lookup and its launch.
int run_lookups(int launches) {
  void *a = 0, *b = 0;
  static char lib;
  int failures = cuLibraryGetKernel(&a, &lib, "kernel_a") + cuLibraryGetKernel(&b, &lib, "kernel_b");
  static char buf[64];
  for (int i = 0; i < launches; ++i) {
    if (i % 10 == 9) {
      void *f = 0;
      failures += cuKernelGetFunction(&f, a);
      failures += cudaMemsetAsync(buf, 7, sizeof(buf), NULL);
      failures += cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0);
    } else {
      failures += launch(i % 2 ? b : a);
    }
  }
  return failures;
}

// A runtime launch as libcudart makes one for a kernel of a library it loaded through the driver:
// the host stub's kernel is asked for its function (cuKernelGetFunction), which is launched.
struct dim3 {
  unsigned x, y, z;
};

// The host stub, named as the kernel (a real stub is named otherwise, or not at all).
__attribute__((noinline)) void kernel_c(void) { __asm__ volatile("" ::: "memory"); }

__attribute__((noinline)) int cudaLaunchKernel(const void *func, struct dim3 grid, struct dim3 block, void **args,
                                               size_t shmem, void *stream) {
  static void *kernel;
  static char lib;
  int err = 0;
  if (!kernel) err += cuLibraryGetKernel(&kernel, &lib, "kernel_c");
  void *f = 0;
  err += cuKernelGetFunction(&f, kernel);
  return err + (func ? cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shmem, stream,
                                      args, 0)
                     : 1);
}

int run_runtime_launches(int launches) {
  int failures = 0;
  struct dim3 grid = {2, 1, 1}, block = {64, 1, 1};
  for (int i = 0; i < launches; ++i) failures += cudaLaunchKernel((const void *)kernel_c, grid, block, 0, 0, 0);
  return failures;
}
