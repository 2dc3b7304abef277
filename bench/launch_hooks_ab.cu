// What the in-process launch hooks add to one launch, measured inside one process so that the
// machine's drift between processes (±10% on the H100 VM) does not hide tens of nanoseconds:
// batches of cuLaunchKernel of an empty <<<1,32>>> kernel over S streams, alternately through
//   hooked  the entry point the runtime hands out (cudaGetDriverEntryPointByVersion): with
//           libgpuscope_launches.so preloaded, the hooks' wrapper
//   real    libcuda's own definition, found with the C library's dlsym (found with dlvsym: the
//           hooks interpose dlsym, not dlvsym)
// Between batches the streams are synchronised (not timed), so the GPU's queues never fill and a
// batch is bound by the CPU side of a launch.
//   launch_hooks_ab [--batches 400] [--batch 1000] [--streams 8]
// Run it under bench/launch_ring_drain (which preloads the hooks and drains their ring), and alone
// as the control (both paths are then libcuda's). Prints one JSON line: the median ns per launch of
// each path, the median of the paired differences, and its interquartile range.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void empty_kernel() {}

using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

static double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

int main(int argc, char** argv) {
  int batches = 400, batch = 1000, nstreams = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--batches")) batches = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--streams")) nstreams = std::max(1, atoi(argv[i + 1]));
  }
  if (cudaFree(nullptr) != cudaSuccess) {
    fprintf(stderr, "launch_hooks_ab: no CUDA device\n");
    return 1;
  }
  empty_kernel<<<1, 32>>>();
  cudaDeviceSynchronize();
  CUfunction f = nullptr;
  if (cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(empty_kernel)) != cudaSuccess) {
    fprintf(stderr, "launch_hooks_ab: cudaGetFuncBySymbol failed\n");
    return 1;
  }
  void* hooked = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &hooked, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      !hooked) {
    fprintf(stderr, "launch_hooks_ab: cudaGetDriverEntryPointByVersion(cuLaunchKernel) failed\n");
    return 1;
  }
  // The C library's own dlsym (the hooks interpose dlsym, not dlvsym), asked of libcuda itself.
  using DlsymFn = void* (*)(void*, const char*);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  auto* libc_dlsym = reinterpret_cast<DlsymFn>(libc ? dlvsym(libc, "dlsym", "GLIBC_2.34") : nullptr);
  if (!libc_dlsym && libc) libc_dlsym = reinterpret_cast<DlsymFn>(dlvsym(libc, "dlsym", "GLIBC_2.2.5"));
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void* real = libcuda && libc_dlsym ? libc_dlsym(libcuda, "cuLaunchKernel") : nullptr;
  if (!real) {
    fprintf(stderr, "launch_hooks_ab: libcuda's own cuLaunchKernel not found\n");
    return 1;
  }
  std::vector<cudaStream_t> streams(static_cast<size_t>(nstreams));
  for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);

  auto run = [&](LaunchFn launch) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i)
      launch(f, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(streams[size_t(i % nstreams)]), nullptr, nullptr);
    const auto t1 = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / batch;
  };
  auto* h = reinterpret_cast<LaunchFn>(hooked);
  auto* r = reinterpret_cast<LaunchFn>(real);
  for (int i = 0; i < 20; ++i) run(i % 2 ? h : r);  // warm both paths
  std::vector<double> hv, rv, diff;
  for (int b = 0; b < batches; ++b) {
    // Alternating which goes first cancels any effect of order within a pair.
    double x, y;
    if (b % 2) {
      x = run(h);
      y = run(r);
    } else {
      y = run(r);
      x = run(h);
    }
    hv.push_back(x);
    rv.push_back(y);
    diff.push_back(x - y);
  }
  printf("{\"hooked_is_real\": %s, \"batches\": %d, \"batch\": %d, \"streams\": %d, \"hooked_ns\": %.1f, "
         "\"real_ns\": %.1f, \"added_ns\": %.1f, \"added_q25\": %.1f, \"added_q75\": %.1f}\n",
         hooked == real ? "true" : "false", batches, batch, nstreams, median(hv), median(rv), median(diff),
         quantile(diff, 0.25), quantile(diff, 0.75));
  return 0;
}
