/* Launches reached as CUDA's runtime and libraries reach them: libcuda.so.1 opened with dlopen,
 * cuGetProcAddress found with dlsym, the launch entry points looked up through it (the legacy and
 * the per-thread default stream's), and one looked up with dlsym directly. Run against the
 * stand-in driver (fake_cuda.c) for the launch hooks' tests, and on the GPU machine against the
 * real one (where the function handles are not kernels and every launch fails, counted all the same).
 *
 *   driver_lookups [--launches N] [--threads T] [--fork] [--library-kernels K] [--wait-file F --after M
 *                  [--then-wait G]]
 * Each of T threads makes N launches of each kind; --fork: a child makes N more through the
 * pointers its parent looked up; --library-kernels: then K launches of a library's kernel as
 * cuBLASLt makes them (cuLibraryGetKernel once, cuKernelGetFunction before each launch, the
 * function on the stack), named "lib_kernel_a" and "lib_kernel_b" in turns. --wait-file: then it
 * says "waiting" on stderr, waits for F to exist, and makes M launches of each kind and M of the
 * library's kernels more (with --library-kernels; a process gpuscope attaches to); --then-wait:
 * then it says "waiting" again and waits for G before it ends. Prints one JSON line of what it made
 * and the driver counted. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*get_proc_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                         void **);
typedef struct {
  unsigned gx, gy, gz, bx, by, bz, shmem;
  void *stream;
  void *attrs;
  unsigned nattrs;
} launch_config;
typedef int (*launch_ex_fn)(const launch_config *, void *, void **, void **);
typedef int (*graph_launch_fn)(void *, void *);
typedef int (*library_get_kernel_fn)(void **, void *, const char *);
typedef int (*kernel_get_function_fn)(void **, void *);

static launch_fn launch, launch_ptsz;
static launch_ex_fn launch_ex;
static graph_launch_fn graph_launch;
static long n = 1000;
static int failed;

static void launches(long count) {
  void *params[] = {0};
  for (long i = 0; i < count; ++i) {
    failed |= launch((void *)0x1000, (unsigned)(i % 7 + 1), 2, 3, 32, 4, 1, 256, (void *)0x10, params, 0);
    failed |= launch_ptsz((void *)0x2000, 1, 1, 1, 128, 1, 1, 0, 0, params, 0);
    launch_config c = {5, 1, 1, 64, 1, 1, 512, (void *)0x20, 0, 0};
    failed |= launch_ex(&c, (void *)0x3000, params, 0);
    failed |= graph_launch((void *)0x4000, (void *)0x30);
  }
}

/* Kept from inlining: the function it asks for lives in this frame only, as in a library's launcher. */
static __attribute__((noinline)) int launch_library_kernel(kernel_get_function_fn get_function, void *kernel) {
  void *function = 0;
  void *params[] = {0};
  if (get_function(&function, kernel)) return 1;
  return launch(function, 1, 1, 1, 64, 1, 1, 0, 0, params, 0);
}

static double ns_per_launch;  /* the first thread's */

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *thread_main(void *arg) {
  const double t0 = now_ns();
  launches(n);
  if (arg) ns_per_launch = (now_ns() - t0) / (4.0 * n);
  return 0;
}

int main(int argc, char **argv) {
  int threads = 1, fork_child = 0;
  long library_kernels = 0, after = 0;
  const char *wait_file = 0, *then_wait = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--library-kernels") && i + 1 < argc) library_kernels = atol(argv[++i]);
    else
    if (!strcmp(argv[i], "--launches") && i + 1 < argc) n = atol(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--fork")) fork_child = 1;
    else if (!strcmp(argv[i], "--wait-file") && i + 1 < argc) wait_file = argv[++i];
    else if (!strcmp(argv[i], "--after") && i + 1 < argc) after = atol(argv[++i]);
    else if (!strcmp(argv[i], "--then-wait") && i + 1 < argc) then_wait = argv[++i];
  }
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) {
    fprintf(stderr, "driver_lookups: %s\n", dlerror());
    return 2;
  }
  get_proc_v2_fn get_proc = (get_proc_v2_fn)dlsym(cuda, "cuGetProcAddress_v2");
  int status = 0;
  if (!get_proc || get_proc("cuLaunchKernel", (void **)&launch, 12000, 1, &status) ||
      get_proc("cuLaunchKernel", (void **)&launch_ptsz, 12000, 2, &status)) {
    fprintf(stderr, "driver_lookups: no cuGetProcAddress_v2 or cuLaunchKernel\n");
    return 2;
  }
  /* cuGetProcAddress asked for through itself, as the runtime does. */
  get_proc_v2_fn again = 0;
  if (get_proc("cuGetProcAddress", (void **)&again, 12000, 0, &status) || !again ||
      again("cuGraphLaunch", (void **)&graph_launch, 12000, 0, &status)) {
    fprintf(stderr, "driver_lookups: no cuGraphLaunch\n");
    return 2;
  }
  launch_ex = (launch_ex_fn)dlsym(cuda, "cuLaunchKernelEx");
  /* dlsym(RTLD_NEXT) still answers for its caller, as without the hooks. */
  void *next_getpid = dlsym(RTLD_NEXT, "getpid");
  if (!launch_ex || !next_getpid || dlsym(cuda, "no_such_symbol")) {
    fprintf(stderr, "driver_lookups: dlsym answered wrongly\n");
    return 2;
  }
  pthread_t ts[64];
  if (threads > 64) threads = 64;
  for (int t = 0; t < threads; ++t) pthread_create(&ts[t], 0, thread_main, t ? 0 : (void *)1);
  for (int t = 0; t < threads; ++t) pthread_join(ts[t], 0);
  long child_launches = 0;
  if (fork_child) {
    const pid_t child = fork();
    if (child == 0) {
      launches(n);
      _exit(failed ? 1 : 0);
    }
    int st = 0;
    waitpid(child, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
      failed = 1;
      fprintf(stderr, "driver_lookups: the child %s %d\n", WIFEXITED(st) ? "exited" : "was killed by signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    child_launches = 4 * n;
  }
  if (library_kernels) {
    library_get_kernel_fn get_kernel = 0;
    kernel_get_function_fn get_function = 0;
    void *kernels[2] = {0, 0};
    if (get_proc("cuLibraryGetKernel", (void **)&get_kernel, 12000, 0, &status) ||
        get_proc("cuKernelGetFunction", (void **)&get_function, 12000, 0, &status) ||
        get_kernel(&kernels[0], (void *)0x5000, "lib_kernel_a") || get_kernel(&kernels[1], (void *)0x5000, "lib_kernel_b")) {
      fprintf(stderr, "driver_lookups: no cuLibraryGetKernel or cuKernelGetFunction\n");
      return 2;
    }
    for (long i = 0; i < library_kernels; ++i) failed |= launch_library_kernel(get_function, kernels[i % 2]);
    if (wait_file) {
      fprintf(stderr, "waiting\n");
      while (access(wait_file, F_OK) != 0) usleep(10000);
      launches(after);
      for (long i = 0; i < after; ++i) failed |= launch_library_kernel(get_function, kernels[i % 2]);
      if (then_wait) {
        fprintf(stderr, "waiting\n");
        while (access(then_wait, F_OK) != 0) usleep(10000);
      }
    }
  }
  uint64_t (*counted)(void) = (uint64_t(*)(void))dlsym(cuda, "fake_cuda_launches");
  printf("{\"pid\": %d, \"launches\": %ld, \"child_launches\": %ld, \"after\": %ld, \"driver_counted\": %lld, "
         "\"failed\": %d, \"ns_per_launch\": %.1f}\n",
         (int)getpid(), 4 * n * threads + library_kernels, child_launches, wait_file ? 5 * after : 0,
         counted ? (long long)counted() : -1LL, failed, ns_per_launch);
  return 0;
}
