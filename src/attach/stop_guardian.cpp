#include "attach/stop_guardian.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <iterator>
#include <cstring>

#include "common/error.h"

namespace gpuscope::attach {
namespace {

// Closes every descriptor above 2 but these three: the guardian must not keep gpuscope's probes
// (BPF links), ring buffer or files alive, nor the write end of its own pipe. No allocation (see
// guard).
void close_all_but(int a, int b, int c) {
  int keep[3] = {a, b, c};
  std::sort(std::begin(keep), std::end(keep));
  unsigned from = 3;
  for (int fd : keep) {
    if (fd < 0) continue;
    if (unsigned(fd) > from) syscall(SYS_close_range, from, unsigned(fd) - 1, 0);
    from = std::max(from, unsigned(fd) + 1);
  }
  syscall(SYS_close_range, from, ~0U, 0);
}

// SIGCONT to every process in the map.
void continue_listed(int held_map_fd) {
  uint32_t key = 0, next = 0;
  bool first = true;
  while (bpf_map_get_next_key(held_map_fd, first ? nullptr : &key, &next) == 0) {
    kill(pid_t(next), SIGCONT);
    key = next;
    first = false;
  }
}

// The guardian's life: system calls only. It is forked from a process whose other threads may
// hold locks (malloc's) that no thread will release in it.
[[noreturn]] void guard(int held_map_fd, int guard_map_fd, int pipe_read) {
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
  close_all_but(held_map_fd, guard_map_fd, pipe_read);
  char byte;
  while (read(pipe_read, &byte, 1) != 0 && (errno == EINTR || errno == EAGAIN)) {
  }
  // gpuscope is gone (or done): no more stops, then continue every process it held, again after
  // a while for one whose stop raced with the first round.
  const uint32_t key = 0, off = 0;
  bpf_map_update_elem(guard_map_fd, &key, &off, BPF_ANY);
  for (int wait_ms : {0, 20, 100, 500}) {
    if (wait_ms) {
      const timespec t{wait_ms / 1000, (wait_ms % 1000) * 1'000'000L};
      nanosleep(&t, nullptr);
    }
    continue_listed(held_map_fd);
  }
  _exit(0);
}

}  // namespace

StopGuardian::StopGuardian(int held_map_fd, int guard_map_fd) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("cannot start the stop guardian: pipe: {}", std::strerror(errno));
  pid_ = fork();
  if (pid_ < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    throw Error("cannot start the stop guardian: fork: {}", std::strerror(err));
  }
  if (pid_ == 0) guard(held_map_fd, guard_map_fd, fds[0]);
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
