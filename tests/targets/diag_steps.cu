// A training loop in miniature for `diagnose`'s tests: STEPS steps, each copying its input from
// pageable memory, launching a kernel 8 times and synchronising, then doing its host-side work,
// which MODE slows down the way real jobs are slowed:
//   clean  10 ms of computation
//   fsync  5 ms of computation, then 8 MiB written to a file in DIR and fsynced (a synchronous checkpoint)
//   pipe   5 ms of computation, then the next input read from a pipe that a child process (a
//          data loader worker) fills at one item every 15 ms
//   sleep  5 ms of computation, then 10 ms asleep
//   memory 5 ms of computation, then 16 MiB read on through a 256 MiB file in DIR (written first):
//          run in a memory cgroup smaller than the file, every read must reclaim page cache
//   faults 3 ms of computation, then 32 MiB of fresh anonymous memory touched page by page and
//          unmapped (8192 page faults a step: time in the kernel)
// (A CPU hog is brought from outside: run it and this on one CPU.) Without a GPU every CUDA call
// fails at once, but each is a real call into the real libcudart, so its probes fire.
//   diag_steps MODE STEPS [DIR]
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

__global__ void step_kernel(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}

volatile double sink;

void compute(double ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(long(ms * 1000));
  double x = 0;
  while (std::chrono::steady_clock::now() < until)
    for (int i = 0; i < 1000; ++i) x += i * 0.25;
  sink = x;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: diag_steps clean|fsync|pipe|sleep STEPS [DIR]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int steps = atoi(argv[2]);
  const std::string dir = argc > 3 ? argv[3] : "/tmp";
  std::vector<float> host(1 << 18, 1.0f);
  float* dev = nullptr;
  cudaMalloc(&dev, host.size() * sizeof(float));
  int pipe_fd[2] = {-1, -1};
  pid_t worker = 0;
  if (mode == "pipe") {
    if (pipe(pipe_fd)) return 1;
    worker = fork();
    if (worker == 0) {
      close(pipe_fd[0]);
      char item = 1;
      for (int i = 0; i < steps; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(15));
        if (write(pipe_fd[1], &item, 1) != 1) _exit(1);
      }
      _exit(0);
    }
    close(pipe_fd[1]);
  }
  std::vector<char> block(8 << 20, 'x');
  int data_fd = -1;
  const size_t data_bytes = size_t(256) << 20, chunk = size_t(16) << 20;
  size_t data_at = 0;
  if (mode == "memory") {
    const std::string path = dir + "/diag_steps.data";
    data_fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; data_fd >= 0 && done < data_bytes; done += block.size())
      if (write(data_fd, block.data(), block.size()) != ssize_t(block.size())) return 1;
    if (data_fd < 0) return 1;
    unlink(path.c_str());
  }
  std::vector<char> chunk_buf(mode == "memory" ? chunk : 0);
  for (int s = 0; s < steps; ++s) {
    cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    for (int k = 0; k < 8; ++k) step_kernel<<<256, 1024>>>(dev, int(host.size()));
    cudaDeviceSynchronize();
    if (mode == "clean") {
      compute(10);
    } else if (mode == "fsync") {
      compute(5);
      const std::string path = dir + "/diag_steps.ckpt";
      int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || write(fd, block.data(), block.size()) != ssize_t(block.size())) return 1;
      fsync(fd);
      close(fd);
    } else if (mode == "pipe") {
      compute(5);
      char item;
      if (read(pipe_fd[0], &item, 1) != 1) return 1;
    } else if (mode == "memory") {
      compute(5);
      if (pread(data_fd, chunk_buf.data(), chunk, off_t(data_at)) != ssize_t(chunk)) return 1;
      data_at = (data_at + chunk) % data_bytes;
    } else if (mode == "faults") {
      compute(3);
      const size_t bytes = size_t(32) << 20;
      void* fresh = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (fresh == MAP_FAILED) return 1;
      for (size_t at = 0; at < bytes; at += 4096) static_cast<volatile char*>(fresh)[at] = 1;
      munmap(fresh, bytes);
    } else if (mode == "sleep") {
      compute(5);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (worker) waitpid(worker, nullptr, 0);
  cudaFree(dev);
  printf("diag_steps: %d steps (%s)\n", steps, mode.c_str());
  return 0;
}
