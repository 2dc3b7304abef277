#include "attach/stop_guardian.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace gpuscope::attach {
namespace {

// Closes every descriptor above 2 but `a` and `b`: the guardian must not keep gpuscope's probes
// (BPF links), ring buffer or files alive, nor the write end of its own pipe.
void close_all_but(int a, int b) {
  if (a > b) std::swap(a, b);
  auto close_from_to = [](unsigned lo, unsigned hi) {
    if (lo <= hi) syscall(SYS_close_range, lo, hi, 0);
  };
  close_from_to(3, unsigned(a) - 1);
  close_from_to(unsigned(a) + 1, unsigned(b) - 1);
  close_from_to(unsigned(b) + 1, ~0U);
}

// The guardian's life: system calls only. It is forked from a process whose other threads may
// hold locks (malloc's) that no thread will release in it.
[[noreturn]] void guard(int held_map_fd, int pipe_read) {
  // Whatever is sent to gpuscope's process group (Ctrl-C, SIGTERM) is for gpuscope: the guardian
  // outlives it by design, until the pipe's end.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, nullptr);
  prctl(PR_SET_NAME, "gpuscope-guard", 0, 0, 0);
  const int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, STDIN_FILENO);
    dup2(null, STDOUT_FILENO);
    if (null > STDERR_FILENO) close(null);
  }
  close_all_but(held_map_fd, pipe_read);
  char byte;
  while (read(pipe_read, &byte, 1) != 0 && (errno == EINTR || errno == EAGAIN)) {
  }
  // gpuscope is gone (or done): continue every process it still held.
  uint32_t key = 0, next = 0;
  bool first = true;
  while (bpf_map_get_next_key(held_map_fd, first ? nullptr : &key, &next) == 0) {
    kill(pid_t(next), SIGCONT);
    key = next;
    first = false;
  }
  _exit(0);
}

}  // namespace

StopGuardian::StopGuardian(int held_map_fd) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("cannot start the stop guardian: pipe: {}", std::strerror(errno));
  pid_ = fork();
  if (pid_ < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    throw Error("cannot start the stop guardian: fork: {}", std::strerror(err));
  }
  if (pid_ == 0) guard(held_map_fd, fds[0]);
  close(fds[0]);
  pipe_write_ = fds[1];
}

StopGuardian::~StopGuardian() {
  if (pipe_write_ >= 0) close(pipe_write_);
  if (pid_ > 0) {
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace gpuscope::attach
