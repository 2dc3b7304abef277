// What host memory's kind costs a copy on this machine (issue 35's bandwidth table): for each size,
// cudaMemcpy host-to-device and device-to-host from pageable memory (malloc, touched), from memory
// allocated pinned (cudaMallocHost) and from malloc'ed memory registered (cudaHostRegister), the
// median of several copies; and what registering costs (pages touched and untouched) and
// unregistering. Each copy's bytes are checked once per kind.
//
//   build/bench/copy_table [max_mib=1024]     (built with the benchmarks; bench/CMakeLists.txt)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#define CHECK(x)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));              \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median time of `reps` synchronous copies of `n` bytes.
double copy_us(void* dst, const void* src, size_t n, cudaMemcpyKind kind, int reps) {
  CHECK(cudaMemcpy(dst, src, n, kind));  // first touch of the path
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_us();
    CHECK(cudaMemcpy(dst, src, n, kind));
    t.push_back(now_us() - t0);
  }
  return median(t);
}

void fill(unsigned char* p, size_t n, unsigned seed) {
  if (n == 0) return;
  for (size_t i = 0; i < n; i += 4096) p[i] = static_cast<unsigned char>(seed + i / 4096);
  p[n - 1] = static_cast<unsigned char>(seed * 7);
}

bool same(const unsigned char* a, const unsigned char* b, size_t n) {
  for (size_t i = 0; i < n; i += 4096)
    if (a[i] != b[i]) return false;
  return a[n - 1] == b[n - 1];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t max_bytes = size_t(std::max(1, argc > 1 ? std::atoi(argv[1]) : 1024)) << 20;
  CHECK(cudaFree(nullptr));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s; times in us (median); GB/s = bytes / time\n", prop.name);
  std::printf("%10s %5s %11s %11s %11s %9s %9s %9s\n", "bytes", "dir", "pageable_us", "pinned_us", "register_us",
              "pageGB/s", "pinGB/s", "regGB/s");
  std::vector<size_t> sizes;
  for (size_t n = 4096; n <= max_bytes; n *= 4) sizes.push_back(n);
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  for (size_t n : sizes) {
    const int reps = n <= (1 << 20) ? 50 : n <= (64 << 20) ? 15 : 5;
    void* dev = nullptr;
    CHECK(cudaMalloc(&dev, n));
    auto* pageable = static_cast<unsigned char*>(std::malloc(n));
    auto* reg = static_cast<unsigned char*>(std::malloc(n));
    if (!pageable || !reg) {
      std::fprintf(stderr, "out of host memory at %zu bytes\n", n);
      return 1;
    }
    unsigned char* pinned = nullptr;
    CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), n));
    fill(pageable, n, 1);
    fill(pinned, n, 2);
    fill(reg, n, 3);
    const double t_reg0 = now_us();
    CHECK(cudaHostRegister(reg, n, cudaHostRegisterDefault));
    const double reg_touched = now_us() - t_reg0;
    std::vector<unsigned char> back(n);
    bool ok = true;
    for (auto dir : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
      double t[3];
      unsigned char* srcs[3] = {pageable, pinned, reg};
      for (int k = 0; k < 3; ++k) {
        if (dir == cudaMemcpyHostToDevice) {
          t[k] = copy_us(dev, srcs[k], n, dir, reps);
          CHECK(cudaMemcpy(back.data(), dev, n, cudaMemcpyDeviceToHost));
          ok &= same(back.data(), srcs[k], n);
        } else {
          CHECK(cudaMemcpy(dev, srcs[k], n, cudaMemcpyHostToDevice));
          std::memset(srcs[k], 0, n);
          t[k] = copy_us(srcs[k], dev, n, dir, reps);
          fill(back.data(), n, k + 1);
          ok &= same(back.data(), srcs[k], n);
        }
      }
      std::printf("%10zu %5s %11.1f %11.1f %11.1f %9.2f %9.2f %9.2f%s\n", n, dir == cudaMemcpyHostToDevice ? "H2D" : "D2H",
                  t[0], t[1], t[2], n / t[0] / 1e3, n / t[1] / 1e3, n / t[2] / 1e3, ok ? "" : "  WRONG BYTES");
    }
    const double t_unreg0 = now_us();
    CHECK(cudaHostUnregister(reg));
    const double unreg = now_us() - t_unreg0;
    // Registering pages never touched: the driver faults them in.
    auto* fresh = static_cast<unsigned char*>(std::malloc(n));
    const double t_fresh0 = now_us();
    CHECK(cudaHostRegister(fresh, n, cudaHostRegisterDefault));
    const double reg_fresh = now_us() - t_fresh0;
    CHECK(cudaHostUnregister(fresh));
    std::printf("%10zu  reg: touched %.1f us, untouched %.1f us; unregister %.1f us\n", n, reg_touched, reg_fresh,
                unreg);
    std::free(fresh);
    std::free(pageable);
    std::free(reg);
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dev));
  }
  return 0;
}
