// Copies of host buffers of 4 KB to 1 GB, each buffer allocated, filled or read, copied R times
// (1, 2, 10, 100) to or from the GPU, synchronously or asynchronously, and freed: one "trial",
// timed whole (allocation and registration included). --alloc says how the buffer is made:
//   malloc       pageable (run under libgpuscope_pin.so, this is what the pinning library does)
//   mallochost   cudaMallocHost for everything
// Every trial's bytes are checked: a host-to-device trial's last copy is compared on the GPU with
// the pattern the host wrote, a device-to-host trial's buffer on the host with the device's.
// One JSON line per trial on stdout; bench/pin/pin_bench.py runs the kinds in turns and compares.
//
//   build/bench/pin_bench --alloc malloc|mallochost [--trials 3] [--max-mib 1024] [--quick]
#include <cuda_runtime.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(x)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "pin_bench: %s: %s\n", #x, cudaGetErrorString(e_));   \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

__global__ void fill_device(unsigned char* p, size_t n, unsigned char v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}
__global__ void count_wrong(const unsigned char* p, size_t n, unsigned char v, unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    mine += p[i] != v;
  if (mine) atomicAdd(wrong, mine);
}

// Bytes that are not v (eight at a time: a gigabyte is read in a tenth of a second).
size_t host_wrong(const unsigned char* p, size_t n, unsigned char v) {
  const uint64_t want = 0x0101010101010101ull * v;
  size_t wrong = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != want)
      for (size_t k = 0; k < 8; ++k) wrong += p[i + k] != v;
  }
  for (; i < n; ++i) wrong += p[i] != v;
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  std::string alloc = "malloc";
  int trials = 3;
  size_t max_mib = 1024;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--alloc" && i + 1 < argc) alloc = argv[++i];
    else if (a == "--trials" && i + 1 < argc) trials = std::atoi(argv[++i]);
    else if (a == "--max-mib" && i + 1 < argc) max_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: pin_bench --alloc malloc|mallochost [--trials N] [--max-mib M] [--quick]\n");
      return 2;
    }
  }
  const bool pinned = alloc == "mallochost";
  std::vector<size_t> sizes = {4096, 65536, 1 << 20, 16 << 20, 256 << 20, size_t(1) << 30};
  if (quick) sizes = {65536, 1 << 20, 16 << 20};
  const int reuses[] = {1, 2, 10, 100};
  unsigned char* dev = nullptr;
  size_t largest = 0;
  for (size_t s : sizes)
    if (s <= max_mib << 20) largest = std::max(largest, s);
  CHECK(cudaMalloc(&dev, largest));
  unsigned long long* wrong_dev = nullptr;
  CHECK(cudaMalloc(&wrong_dev, sizeof *wrong_dev));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int trial_no = 0;
  const double cpu0 = cpu_ms(), wall0 = now_ms();
  for (size_t size : sizes) {
    if (size > max_mib << 20) continue;
    for (int reuse : reuses) {
      // 100 copies of the largest buffers would take minutes from pageable memory.
      if (size >= (size_t(256) << 20) && reuse > 10) continue;
      for (int dir = 0; dir < 2; ++dir) {
        const bool h2d = dir == 0;
        for (int async = 0; async < 2; ++async) {
          if (async && size > (size_t(16) << 20)) continue;
          for (int t = 0; t < trials; ++t, ++trial_no) {
            const unsigned char v = static_cast<unsigned char>(trial_no * 131 + 7);
            if (!h2d) {
              fill_device<<<1024, 256>>>(dev, size, v);
              CHECK(cudaDeviceSynchronize());
            }
            const double t0 = now_ms();
            unsigned char* buf = nullptr;
            if (pinned) CHECK(cudaMallocHost(&buf, size));
            else buf = static_cast<unsigned char*>(std::malloc(size));
            if (!buf) {
              std::fprintf(stderr, "pin_bench: out of host memory\n");
              return 1;
            }
            if (h2d) std::memset(buf, v, size);
            for (int r = 0; r < reuse; ++r) {
              if (async) {
                CHECK(cudaMemcpyAsync(h2d ? static_cast<void*>(dev) : buf, h2d ? static_cast<void*>(buf) : dev, size,
                                      h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream));
              } else {
                CHECK(cudaMemcpy(h2d ? static_cast<void*>(dev) : buf, h2d ? static_cast<void*>(buf) : dev, size,
                                 h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
              }
            }
            if (async) CHECK(cudaStreamSynchronize(stream));
            size_t wrong = 0;
            if (!h2d) wrong = host_wrong(buf, size, v);  // read, as a program would read what came back
            if (pinned) CHECK(cudaFreeHost(buf));
            else std::free(buf);
            const double ms = now_ms() - t0;
            if (h2d) {
              CHECK(cudaMemset(wrong_dev, 0, sizeof *wrong_dev));
              count_wrong<<<1024, 256>>>(dev, size, v, wrong_dev);
              unsigned long long w = 0;
              CHECK(cudaMemcpy(&w, wrong_dev, sizeof w, cudaMemcpyDeviceToHost));
              wrong = w;
            }
            std::printf("{\"alloc\": \"%s\", \"bytes\": %zu, \"reuse\": %d, \"dir\": \"%s\", \"async\": %d, "
                        "\"trial\": %d, \"ms\": %.4f, \"wrong\": %zu}\n",
                        alloc.c_str(), size, reuse, h2d ? "h2d" : "d2h", async, t, ms, wrong);
          }
        }
      }
    }
  }
  std::printf("{\"alloc\": \"%s\", \"total_wall_ms\": %.1f, \"total_cpu_ms\": %.1f}\n", alloc.c_str(),
              now_ms() - wall0, cpu_ms() - cpu0);
  return 0;
}
