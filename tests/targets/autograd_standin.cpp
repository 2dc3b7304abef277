// A stand-in for PyTorch's libtorch_cpu.so (built under that name): Engine::execute hands its
// work to a thread of its own, which runs it under Engine::thread_main and makes the CUDA calls,
// while the caller waits, as the autograd engine does for a backward pass. The names are
// PyTorch's; the signatures are simpler (gpuscope matches the names' prefixes). The worker thread
// is named as PyTorch names its own ("pt_autograd_0"); with `by_name_only` it runs its work outside
// thread_main, as a walk cut short before thread_main's frame would see it.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>
#include <cstdio>
#include <thread>

namespace {
struct Dim3 {
  unsigned x, y, z;
};
using Launch = int (*)(const void* func, Dim3 grid, Dim3 block, void** args, size_t shmem, void* stream);
Launch cuda_launch_kernel;
void kernel_stub() {}  // a made-up kernel: without a GPU every launch fails, and each is recorded
}  // namespace

extern "C" __attribute__((noinline)) int launch_kernels(int n) {
  int failed = 0;
  for (int i = 0; i < n; ++i)
    failed += cuda_launch_kernel(reinterpret_cast<const void*>(&kernel_stub), {unsigned(i + 1), 1, 1}, {32, 1, 1},
                                 nullptr, 0, nullptr) != 0;
  return failed;
}

namespace torch::autograd {

struct Engine {
  __attribute__((noinline)) int thread_main(int n);
  __attribute__((noinline)) int execute(int n, bool by_name_only);
};

__attribute__((noinline)) int Engine::thread_main(int n) {
  volatile int failed = launch_kernels(n);  // no tail call: this frame stays on the stack
  return failed;
}

__attribute__((noinline)) int Engine::execute(int n, bool by_name_only) {
  int result = 0;
  std::thread worker([&] {
    pthread_setname_np(pthread_self(), "pt_autograd_0");
    result = by_name_only ? launch_kernels(n) : thread_main(n);
  });
  worker.join();
  return result;
}

}  // namespace torch::autograd

// Called through ctypes by tests/targets/py_backward.py. Returns the failed launches (all of them
// without a GPU), or -1 if libcudart cannot be loaded.
extern "C" int run_backward(const char* libcudart, int n, int by_name_only) {
  if (!cuda_launch_kernel) {
    void* h = dlopen(libcudart, RTLD_NOW);
    if (!h) {
      std::fprintf(stderr, "%s\n", dlerror());
      return -1;
    }
    cuda_launch_kernel = reinterpret_cast<Launch>(dlsym(h, "cudaLaunchKernel"));
  }
  torch::autograd::Engine engine;
  return engine.execute(n, by_name_only != 0);
}
