// The benchmark workload: threads making probed CUDA calls as fast as they can.
//   launch_loop --calls N [--threads T] [--mode invalid|real|free-null] [--streams S] [--rate R] [--depth D]
// invalid:   cudaLaunchKernel of a function that is no kernel (fails inside the runtime, no GPU work)
// real:      cudaLaunchKernel of an empty <<<1,32>>> kernel (needs a GPU), round-robin over S
//            streams per thread: on one stream the GPU runs these no faster than ~4 us each, which
//            hides CPU cost added below that; several streams run them concurrently, so the loop
//            is bound by the CPU side of a launch, which is what the probes add to.
// free-null: cudaFree(nullptr), a call with entry and return probes
// --rate R:  at most R calls per second per thread (paced every 1 ms), for a steady event rate
// --depth D: make the calls D nested function calls deep (stack walkers' cost per frame)
// Prints one JSON line: calls, seconds, ns per call (per thread), calls per second (all threads).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

__global__ void empty_kernel() {}

static void not_a_kernel() {}

// Runs f() `depth` frames below the caller; the volatile use after the call keeps the recursion
// from becoming a tail call (a loop).
template <class F>
__attribute__((noinline)) int nest(int depth, F& f) {
  if (depth <= 0) {
    f();
    return 0;
  }
  volatile int keep = depth;
  int r = nest(depth - 1, f);
  return r + keep;
}

int main(int argc, char** argv) {
  long calls = 100000;
  int threads = 1;
  int streams = 1;
  std::string mode = "invalid";
  double rate = 0;
  int depth = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--calls")) calls = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
    else if (!strcmp(argv[i], "--streams")) streams = atoi(argv[i + 1]) > 0 ? atoi(argv[i + 1]) : 1;
    else if (!strcmp(argv[i], "--rate")) rate = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--depth")) depth = atoi(argv[i + 1]);
  }
  if (mode == "real") {
    cudaFree(nullptr);
    empty_kernel<<<1, 32>>>();
    cudaDeviceSynchronize();
  }
  // Sleeps until call i is due (with --rate), checked once per 64 calls.
  auto pace = [&](long i, std::chrono::steady_clock::time_point start) {
    if (rate <= 0 || (i & 63) != 0) return;
    const auto due = start + std::chrono::duration<double>(double(i) / rate);
    std::this_thread::sleep_until(std::chrono::time_point_cast<std::chrono::steady_clock::duration>(due));
  };
  auto loop = [&] {
    const auto start = std::chrono::steady_clock::now();
    if (mode == "real") {
      std::vector<cudaStream_t> s(streams);
      for (auto& one : s) cudaStreamCreateWithFlags(&one, cudaStreamNonBlocking);
      for (long i = 0; i < calls; ++i) {
        pace(i, start);
        empty_kernel<<<1, 32, 0, s[i % streams]>>>();
        if ((i & 1023) == 1023)
          for (auto& one : s) cudaStreamSynchronize(one);
      }
      for (auto& one : s) cudaStreamSynchronize(one);
    } else if (mode == "free-null") {
      for (long i = 0; i < calls; ++i) {
        pace(i, start);
        cudaFree(nullptr);
      }
    } else {
      for (long i = 0; i < calls; ++i) {
        pace(i, start);
        cudaLaunchKernel(reinterpret_cast<const void*>(&not_a_kernel), dim3(1), dim3(1), nullptr, 0, nullptr);
      }
    }
  };
  auto body = [&] { nest(depth, loop); };
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body);
  for (auto& t : pool) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("{\"mode\": \"%s\", \"threads\": %d, \"streams\": %d, \"calls\": %ld, \"seconds\": %.6f, \"ns_per_call\": %.1f, "
         "\"calls_per_second\": %.0f}\n",
         mode.c_str(), threads, streams, calls * threads, secs, secs * 1e9 / calls, calls * threads / secs);
  return 0;
}
