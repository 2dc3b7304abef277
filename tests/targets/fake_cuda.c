/* A stand-in CUDA driver (libcuda.so.1) for machines without one: cuGetProcAddress hands out its
 * launch entry points, which count their calls and succeed, and its copy and host-registration
 * entry points, which copy with memcpy ("device" memory is the program's) and keep the registered
 * ranges as the real driver does (overlaps refused, unregistration by base address). Only for the
 * tests of the launch hooks (src/inject/launch_hooks.cpp) and of the pinning library
 * (src/pin/preload.cpp): the real libcudart needs far more of a driver than this. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static volatile uint64_t launches;

uint64_t fake_cuda_launches(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }

__attribute__((noinline)) static int count(void) {
  __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
  return 0;
}

int cuInit(unsigned flags) { return flags ? 1 : 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *s, void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)s, (void)params, (void)extra;
  return count();
}
int cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *s, void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)s, (void)params, (void)extra;
  return count();
}
int cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
  (void)config, (void)f, (void)params, (void)extra;
  return count();
}
int cuLaunchKernelEx_ptsz(const void *config, void *f, void **params, void **extra) {
  (void)config, (void)f, (void)params, (void)extra;
  return count();
}
int cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                              unsigned shmem, void *s, void **params) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)s, (void)params;
  return count();
}
int cuGraphLaunch(void *g, void *s) { (void)g, (void)s; return count(); }
int cuGraphLaunch_ptsz(void *g, void *s) { (void)g, (void)s; return count(); }
int cuCtxSynchronize(void) { return 0; }
int cuDeviceGet(int *device, int ordinal) {
  *device = ordinal;
  return 0;
}

/* A library's kernels, as cuBLASLt reaches them: a kernel by name, then its function before each
 * launch. The kernel's handle is its name's address; its function, that plus one. */
int cuLibraryGetKernel(void **kernel, void *library, const char *name) {
  (void)library;
  if (!kernel || !name) return 1;
  *kernel = (void *)name;
  return 0;
}
int cuKernelGetFunction(void **function, void *kernel) {
  if (!function || !kernel) return 1;
  *function = (char *)kernel + 1;
  return 0;
}

/* The driver's names: driver_lookups' fixed handles have mangled names, 0x3000 being a CUkernel
 * launched in place of a function (as CUDA 12's runtime launches its kernels), which only
 * cuKernelGetName names; a library kernel's function is named as its kernel (its handle less one
 * is the kernel's name). */
int cuFuncGetName(const char **name, void *function) {
  if (!name || !function) return 1;
  if ((uintptr_t)function == 0x1000) *name = "_Z12fake_kernel1Pfi";
  else if ((uintptr_t)function == 0x2000) *name = "_Z12fake_kernel2v";
  else if ((uintptr_t)function > 0x100000) *name = (const char *)function - 1; /* an address in the program */
  else return 400; /* CUDA_ERROR_INVALID_HANDLE */
  return 0;
}
int cuKernelGetName(const char **name, void *kernel) {
  if (!name || (uintptr_t)kernel != 0x3000) return 400;
  *name = "_Z12fake_kernel3Pd";
  return 0;
}


/* ---- host memory registration, as the pinning library uses it ---- */

#define MAX_REGISTERED 256
static struct { uintptr_t base, bytes; } registered[MAX_REGISTERED];
static int registrations_here; /* register and unregister calls by this process (not its parent) */
static pid_t owner;
static uint64_t syncs;

static void count_call(void) {
  if (owner != getpid()) owner = getpid(), registrations_here = 0;
  ++registrations_here;
}
int fake_cuda_register_calls(void) { return owner == getpid() ? registrations_here : 0; }
uint64_t fake_cuda_syncs(void) { return syncs; }
/* Registered range i (0 when i is past the table). */
int fake_cuda_range(int i, uintptr_t *base, size_t *bytes) {
  if (i < 0 || i >= MAX_REGISTERED) return 0;
  *base = registered[i].base, *bytes = registered[i].bytes;
  return 1;
}
/* How many registered ranges overlap [p, p + n). */
int fake_cuda_registered(const void *p, size_t n) {
  int k = 0;
  for (int i = 0; i < MAX_REGISTERED; ++i)
    if (registered[i].bytes && registered[i].base < (uintptr_t)p + n && (uintptr_t)p < registered[i].base + registered[i].bytes)
      ++k;
  return k;
}

int cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
  (void)flags;
  count_call();
  if (!p || !n) return 1;                              /* CUDA_ERROR_INVALID_VALUE */
  if (fake_cuda_registered(p, n)) return 712;          /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
  for (size_t off = 0; off < n; off += 4096) ((volatile char *)p)[off] += 0; /* the driver touches every page */
  for (int i = 0; i < MAX_REGISTERED; ++i)
    if (!registered[i].bytes) {
      registered[i].base = (uintptr_t)p, registered[i].bytes = n;
      return 0;
    }
  return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}
int cuMemHostUnregister(void *p) {
  count_call();
  for (int i = 0; i < MAX_REGISTERED; ++i)
    if (registered[i].bytes && registered[i].base == (uintptr_t)p) {
      registered[i].bytes = 0;
      return 0;
    }
  return 713; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
}
static char context;
int cuCtxGetCurrent(void **c) { *c = &context; return 0; }
int cuCtxPushCurrent_v2(void *c) { (void)c; return 0; }
int cuCtxPopCurrent_v2(void **c) { if (c) *c = &context; return 0; }
int cuStreamSynchronize(void *s) { (void)s; ++syncs; return 0; }

typedef unsigned long long CUdeviceptr;
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { memcpy((void *)dst, src, n); return 0; }
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (const void *)src, n); return 0; }
int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) { (void)s; memcpy((void *)dst, src, n); return 0; }
int cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) { (void)s; memcpy(dst, (const void *)src, n); return 0; }
int cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { memcpy((void *)dst, (const void *)src, n); return 0; }
int cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) { (void)s; memcpy((void *)dst, (const void *)src, n); return 0; }

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status);

/* flags & 2: the per-thread default stream's variant (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). */
static int lookup(const char *symbol, void **pfn, uint64_t flags) {
  const int ptds = (flags & 2) != 0;
  static const struct {
    const char *name;
    void *legacy, *ptsz;
  } table[] = {
      {"cuInit", (void *)cuInit, (void *)cuInit},
      {"cuDriverGetVersion", (void *)cuDriverGetVersion, (void *)cuDriverGetVersion},
      {"cuLaunchKernel", (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
      {"cuLaunchKernelEx", (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz},
      {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel, (void *)cuLaunchCooperativeKernel},
      {"cuGraphLaunch", (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz},
      {"cuCtxSynchronize", (void *)cuCtxSynchronize, (void *)cuCtxSynchronize},
      {"cuGetProcAddress", (void *)cuGetProcAddress_v2, (void *)cuGetProcAddress_v2},
      {"cuLibraryGetKernel", (void *)cuLibraryGetKernel, (void *)cuLibraryGetKernel},
      {"cuKernelGetFunction", (void *)cuKernelGetFunction, (void *)cuKernelGetFunction},
      {"cuFuncGetName", (void *)cuFuncGetName, (void *)cuFuncGetName},
      {"cuKernelGetName", (void *)cuKernelGetName, (void *)cuKernelGetName},
      {"cuMemHostRegister", (void *)cuMemHostRegister_v2, (void *)cuMemHostRegister_v2},
      {"cuMemHostUnregister", (void *)cuMemHostUnregister, (void *)cuMemHostUnregister},
      {"cuMemcpyHtoD", (void *)cuMemcpyHtoD_v2, (void *)cuMemcpyHtoD_v2},
      {"cuMemcpyDtoH", (void *)cuMemcpyDtoH_v2, (void *)cuMemcpyDtoH_v2},
      {"cuMemcpyHtoDAsync", (void *)cuMemcpyHtoDAsync_v2, (void *)cuMemcpyHtoDAsync_v2},
      {"cuMemcpyDtoHAsync", (void *)cuMemcpyDtoHAsync_v2, (void *)cuMemcpyDtoHAsync_v2},
      {"cuMemcpy", (void *)cuMemcpy, (void *)cuMemcpy},
      {"cuMemcpyAsync", (void *)cuMemcpyAsync, (void *)cuMemcpyAsync},
  };
  for (unsigned i = 0; i < sizeof table / sizeof table[0]; ++i)
    if (!strcmp(symbol, table[i].name)) {
      *pfn = ptds ? table[i].ptsz : table[i].legacy;
      return 0;
    }
  *pfn = 0;
  return 500; /* CUDA_ERROR_NOT_FOUND */
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
  (void)version;
  const int r = lookup(symbol, pfn, flags);
  if (status) *status = r ? 1 : 0;
  return r;
}
int cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
  (void)version;
  return lookup(symbol, pfn, flags);
}
