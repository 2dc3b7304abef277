// What pinning a program's memory behind its back could break, each checked on the GPU with the
// bytes that arrive (run under libgpuscope_pin.so: bench/pin/pin_bench.py runs it):
//   async_write    an asynchronous copy from a buffer, then the buffer overwritten at once: from
//                  pageable memory the copy holds the old bytes (strict mode keeps that)
//   async_read     an asynchronous copy to a buffer, read at once without a sync: pageable memory
//                  has the bytes when the call returns
//   free_reuse     a pinned buffer freed and a new one of its size filled and copied
//   realloc        a pinned buffer grown: contents kept, copies from the new one right
//   madvise        MADV_DONTNEED on a pinned buffer, then new bytes written and copied: without the
//                  library unregistering first, the GPU would read the old, still pinned pages
//   fork           a child reads a pinned buffer (pinned pages may be left out of a child)
//   own_register   the program registers a buffer itself, copies, unregisters, frees
// Prints one line per check: "hazard NAME: ok" or "hazard NAME: WRONG ...". Exit 1 if any is wrong.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

#define CHECK(x)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "pin_hazards: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

constexpr size_t kBytes = size_t(64) << 20;
unsigned char* g_dev = nullptr;
unsigned long long* g_wrong = nullptr;
int g_failed = 0;

__global__ void count_wrong(const unsigned char* p, size_t n, unsigned char v, unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    mine += p[i] != v;
  if (mine) atomicAdd(wrong, mine);
}
__global__ void fill(unsigned char* p, size_t n, unsigned char v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

unsigned long long device_wrong(size_t n, unsigned char v) {
  CHECK(cudaMemset(g_wrong, 0, sizeof *g_wrong));
  count_wrong<<<1024, 256>>>(g_dev, n, v, g_wrong);
  unsigned long long w = 0;
  CHECK(cudaMemcpy(&w, g_wrong, sizeof w, cudaMemcpyDeviceToHost));
  return w;
}
size_t host_wrong(const unsigned char* p, size_t n, unsigned char v) {
  size_t w = 0;
  for (size_t i = 0; i < n; ++i) w += p[i] != v;
  return w;
}
void verdict(const char* name, size_t wrong, const char* what = "bytes wrong") {
  if (wrong) ++g_failed;
  if (wrong) std::printf("hazard %s: WRONG (%zu %s)\n", name, wrong, what);
  else std::printf("hazard %s: ok\n", name);
  std::fflush(stdout);
}
// Copied often enough that the library pins it.
void copy_often(unsigned char* buf, size_t n) {
  for (int i = 0; i < 6; ++i) CHECK(cudaMemcpy(g_dev, buf, n, cudaMemcpyHostToDevice));
}

}  // namespace

int main() {
  CHECK(cudaMalloc(&g_dev, 2 * kBytes));
  CHECK(cudaMalloc(&g_wrong, sizeof *g_wrong));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  {  // async_write
    auto* buf = static_cast<unsigned char*>(std::malloc(kBytes));
    std::memset(buf, 1, kBytes);
    copy_often(buf, kBytes);
    std::memset(buf, 2, kBytes);
    CHECK(cudaMemcpyAsync(g_dev, buf, kBytes, cudaMemcpyHostToDevice, s));
    std::memset(buf, 3, kBytes);  // after the call: pageable memory's copy has 2
    CHECK(cudaStreamSynchronize(s));
    verdict("async_write", device_wrong(kBytes, 2));
    std::free(buf);
  }
  {  // async_read
    auto* buf = static_cast<unsigned char*>(std::malloc(kBytes));
    std::memset(buf, 0, kBytes);
    copy_often(buf, kBytes);
    fill<<<1024, 256, 0, s>>>(g_dev, kBytes, 4);  // on the copy's stream: in order before it
    CHECK(cudaMemcpyAsync(buf, g_dev, kBytes, cudaMemcpyDeviceToHost, s));
    verdict("async_read", host_wrong(buf, kBytes, 4));  // no sync: pageable memory has it on return
    CHECK(cudaStreamSynchronize(s));
    std::free(buf);
  }
  {  // free_reuse
    size_t wrong = 0;
    for (int i = 0; i < 8; ++i) {
      auto* buf = static_cast<unsigned char*>(std::malloc(kBytes));
      std::memset(buf, 10 + i, kBytes);
      copy_often(buf, kBytes);
      wrong += device_wrong(kBytes, 10 + i);
      std::free(buf);
    }
    verdict("free_reuse", wrong);
  }
  {  // realloc
    auto* buf = static_cast<unsigned char*>(std::malloc(kBytes));
    std::memset(buf, 20, kBytes);
    copy_often(buf, kBytes);
    buf = static_cast<unsigned char*>(std::realloc(buf, 2 * kBytes));
    size_t wrong = host_wrong(buf, kBytes, 20);
    std::memset(buf, 21, 2 * kBytes);
    copy_often(buf, 2 * kBytes);
    wrong += device_wrong(2 * kBytes, 21);
    verdict("realloc", wrong);
    std::free(buf);
  }
  {  // madvise
    auto* buf = static_cast<unsigned char*>(std::malloc(kBytes));
    std::memset(buf, 30, kBytes);
    copy_often(buf, kBytes);
    // The buffer starts on a page when the library serves it; round in for the C library's.
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(buf) + 4095) & ~uintptr_t(4095);
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(buf) + kBytes) & ~uintptr_t(4095);
    madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    std::memset(buf, 31, kBytes);
    CHECK(cudaMemcpy(g_dev, buf, kBytes, cudaMemcpyHostToDevice));
    verdict("madvise", device_wrong(kBytes, 31));
    std::free(buf);
  }
  {  // fork
    auto* buf = static_cast<unsigned char*>(std::malloc(kBytes));
    std::memset(buf, 40, kBytes);
    copy_often(buf, kBytes);
    // Whether the driver keeps pinned pages out of children (VmFlags "dc" on the mapping).
    if (FILE* f = std::fopen("/proc/self/smaps", "r")) {
      char line[512];
      bool in = false;
      const unsigned long a = reinterpret_cast<unsigned long>(buf);
      while (std::fgets(line, sizeof line, f)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
          in = a >= lo && a < hi;
        } else if (in && !std::strncmp(line, "VmFlags:", 8)) {
          std::printf("fork: the pinned buffer's mapping has %s", line);
          break;
        }
      }
      std::fclose(f);
    }
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) _exit(host_wrong(buf, kBytes, 40) ? 1 : 0);
    int status = 0;
    waitpid(child, &status, 0);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    verdict("fork", ok ? 0 : 1, WIFSIGNALED(status) ? "child killed by a signal" : "child read wrong bytes");
    std::free(buf);
  }
  {  // own_register
    auto* buf = static_cast<unsigned char*>(std::malloc(kBytes));
    std::memset(buf, 50, kBytes);
    CHECK(cudaHostRegister(buf, kBytes, cudaHostRegisterDefault));
    copy_often(buf, kBytes);
    size_t wrong = device_wrong(kBytes, 50);
    CHECK(cudaHostUnregister(buf));
    std::memset(buf, 51, kBytes);
    copy_often(buf, kBytes);
    wrong += device_wrong(kBytes, 51);
    verdict("own_register", wrong);
    std::free(buf);
  }
  std::printf("hazards wrong: %d\n", g_failed);
  return g_failed ? 1 : 0;
}
