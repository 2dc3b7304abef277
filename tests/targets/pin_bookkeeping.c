/* The pinning library's bookkeeping in front of a program that copies as the CUDA runtime does
 * (the driver's entry points from cuGetProcAddress), against the stand-in driver
 * (tests/targets/fake_cuda.c), which keeps the registered ranges. Each check prints
 * "check NAME: ok" or "check NAME: WRONG ...":
 *   pinned         a 4 MiB buffer copied 6 times is registered
 *   contents       every copy carried the buffer's bytes
 *   madvise        MADV_DONTNEED on it: no registered range covers it any more
 *   realloc        grown: contents kept; no registered range left where it was
 *   free_reuse     freed and allocated again from the same line: the same pinned buffer, right bytes
 *   async_waits    an asynchronous copy of a pinned buffer waits for its stream (strict)
 *   own_register   a buffer the program registered itself is left to it
 *   fork           a child frees and allocates pinned buffers: no registration call of its own
 *   unpinned_free  a buffer copied once and freed is not registered
 *   never_given_back  every range still registered is mapped read-write (also after realloc)
 * Run: LD_PRELOAD=libgpuscope_pin.so LD_LIBRARY_PATH=<fake-cuda dir> pin_bookkeeping */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

typedef unsigned long long CUdeviceptr;
typedef int (*get_proc_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef int (*htod_async_fn)(CUdeviceptr, const void *, size_t, void *);
typedef int (*register_fn)(void *, size_t, unsigned);
typedef int (*unregister_fn)(void *);

static htod_fn htod;
static htod_async_fn htod_async;
static int (*registered)(const void *, size_t);
static int (*register_calls)(void);
static uint64_t (*syncs)(void);
static int (*registered_range)(int, uintptr_t *, size_t *);
static int wrong_checks;

/* Every range the driver holds registered is still the program's memory, readable and writable:
 * the library never gives back (or lets the program unmap) what it registered. */
static int all_registered_mapped(void) {
  uintptr_t base;
  size_t bytes;
  for (int i = 0; registered_range(i, &base, &bytes); ++i) {
    if (!bytes) continue;
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512], perms[8];
    unsigned long lo, hi;
    uintptr_t covered = base;
    while (maps && fgets(line, sizeof line, maps))
      if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= covered && covered < hi && perms[0] == 'r' &&
          perms[1] == 'w')
        covered = hi;
    if (maps) fclose(maps);
    if (covered < base + bytes) return 0;
  }
  return 1;
}

static void check(const char *name, int ok, const char *what) {
  if (!ok) ++wrong_checks;
  printf("check %s: %s%s\n", name, ok ? "ok" : "WRONG ", ok ? "" : what);
  fflush(stdout);
}

#define MIB (1u << 20)

static unsigned char device[16 * MIB]; /* the stand-in's "device" memory */

static int copy_often(const unsigned char *buf, size_t n, int times) {
  int ok = 1;
  for (int i = 0; i < times; ++i) {
    htod((CUdeviceptr)device, buf, n);
    ok &= memcmp(device, buf, n) == 0;
  }
  return ok;
}

/* One allocation site for free_reuse: the library keys sites by call stack and size. */
__attribute__((noinline)) static unsigned char *batch(size_t n) { return malloc(n); }

int main(void) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cuda) {
    fprintf(stderr, "pin_bookkeeping: %s\n", dlerror());
    return 2;
  }
  get_proc_fn get_proc = (get_proc_fn)dlsym(cuda, "cuGetProcAddress_v2");
  registered = (int (*)(const void *, size_t))dlsym(cuda, "fake_cuda_registered");
  register_calls = (int (*)(void))dlsym(cuda, "fake_cuda_register_calls");
  syncs = (uint64_t(*)(void))dlsym(cuda, "fake_cuda_syncs");
  registered_range = (int (*)(int, uintptr_t *, size_t *))dlsym(cuda, "fake_cuda_range");
  register_fn host_register = 0;
  unregister_fn host_unregister = 0;
  int status = 0;
  if (!get_proc || !registered || !registered_range || get_proc("cuMemcpyHtoD", (void **)&htod, 12000, 0, &status) ||
      get_proc("cuMemcpyHtoDAsync", (void **)&htod_async, 12000, 0, &status) ||
      get_proc("cuMemHostRegister", (void **)&host_register, 12000, 0, &status) ||
      get_proc("cuMemHostUnregister", (void **)&host_unregister, 12000, 0, &status)) {
    fprintf(stderr, "pin_bookkeeping: the stand-in driver's entry points are missing\n");
    return 2;
  }

  const size_t n = 4 * MIB;
  unsigned char *buf = malloc(n);
  memset(buf, 1, n);
  const int contents = copy_often(buf, n, 6);
  check("pinned", registered(buf, n) == 1, "(the buffer copied 6 times is not registered)");

  const uintptr_t lo = ((uintptr_t)buf + 4095) & ~(uintptr_t)4095;
  madvise((void *)lo, ((uintptr_t)buf + n - lo) & ~(uintptr_t)4095, MADV_DONTNEED);
  check("madvise", registered(buf, n) == 0, "(still registered after MADV_DONTNEED)");
  memset(buf, 2, n);
  int contents2 = copy_often(buf, n, 6);

  unsigned char *old = buf;
  buf = realloc(buf, 2 * n);
  int kept = 1;
  for (size_t i = 0; i < n; ++i) kept &= buf[i] == 2;
  check("realloc", kept && all_registered_mapped(), "(contents lost, or a registered range given back)");
  free(buf);

  int reuse_ok = 1;
  unsigned char *b = 0;
  for (int i = 0; i < 41; ++i) {
    if (b) free(b);
    b = batch(n);
    memset(b, 10 + i, n);
    reuse_ok &= copy_often(b, n, 1);
  }
  check("free_reuse", reuse_ok && registered(b, n) == 1,
        "(a buffer from a line whose buffers are copied each time is not pinned, or bytes differ)");
  check("contents", contents && contents2 && reuse_ok, "(a copy carried other bytes)");

  const uint64_t before = syncs();
  htod_async((CUdeviceptr)device, b, n, 0);
  check("async_waits", syncs() == before + 1, "(an asynchronous copy of a pinned buffer did not wait)");

  unsigned char *own = malloc(n);
  memset(own, 5, n);
  const int own_ok = host_register(own, n, 0) == 0;
  copy_often(own, n, 8);
  check("own_register", own_ok && host_unregister(own) == 0 && registered(own, n) == 0,
        "(the program's own registration was disturbed)");
  free(own);

  const pid_t child = fork();
  if (child == 0) {
    free(b);
    unsigned char *c = batch(n);
    memset(c, 7, n);
    copy_often(c, n, 8);
    free(c);
    _exit(register_calls() == 0 ? 0 : 1);
  }
  waitpid(child, &status, 0);
  check("fork", WIFEXITED(status) && WEXITSTATUS(status) == 0, "(the child made registration calls)");
  free(b);

  unsigned char *once = malloc(8 * MIB);
  memset(once, 3, 8 * MIB);
  copy_often(once, 8 * MIB, 1);
  check("unpinned_free", registered(once, 8 * MIB) == 0, "(a buffer copied once was registered)");
  free(once);

  check("never_given_back", all_registered_mapped(), "(a registered range is no longer mapped read-write)");
  printf("checks wrong: %d\n", wrong_checks);
  return wrong_checks ? 1 : 0;
}
