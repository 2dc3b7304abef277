/* A stand-in CUDA driver (libcuda.so.1) for machines without one: cuGetProcAddress hands out its
 * launch entry points, which count their calls and succeed. Only for the tests of the launch
 * hooks (src/inject/launch_hooks.cpp): the real libcudart needs far more of a driver than this. */
#include <stdint.h>
#include <string.h>

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
