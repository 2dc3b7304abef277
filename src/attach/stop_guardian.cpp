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
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "events.h"

namespace gpuscope::attach {
namespace {

// The maps the guardian keeps.
struct StopMaps {
  int made, answered, guard;
};

// Closes every descriptor above 2 but the maps and the pipe's read end: the guardian must not keep
// gpuscope's probes (BPF links), ring buffer or files alive, nor the write end of its own pipe. No
// allocation (see guard).
void close_all_but(const StopMaps& maps, int pipe_read) {
  int keep[4] = {maps.made, maps.answered, maps.guard, pipe_read};
  std::sort(std::begin(keep), std::end(keep));
  unsigned from = 3;
  for (int fd : keep) {
    if (fd < 0) continue;
    if (unsigned(fd) > from) syscall(SYS_close_range, from, unsigned(fd) - 1, 0);
    from = std::max(from, unsigned(fd) + 1);
  }
  syscall(SYS_close_range, from, ~0U, 0);
}

// SIGCONT to every process with more stops made than answered. One whose answer is missing
// because gpuscope died between its SIGCONT and the note gets a second: harmless.
void continue_unanswered(const StopMaps& maps) {
  uint32_t key = 0, next = 0;
  bool first = true;
  while (bpf_map_get_next_key(maps.made, first ? nullptr : &key, &next) == 0) {
    gs_stop_count made{}, answered{};
    if (bpf_map_lookup_elem(maps.made, &next, &made) == 0 &&
        (bpf_map_lookup_elem(maps.answered, &next, &answered) != 0 || answered.start_ns != made.start_ns ||
         answered.count < made.count))
      kill(pid_t(next), SIGCONT);
    key = next;
    first = false;
  }
}

void sleep_ms(int ms) {
  const timespec t{ms / 1000, (ms % 1000) * 1'000'000L};
  nanosleep(&t, nullptr);
}

uint64_t now_ms() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1000 + uint64_t(t.tv_nsec) / 1'000'000;
}

// Whether the program that stops processes still exists: held by a descriptor of gpuscope's or
// by a link the kernel has not released yet. Only while it exists can a process be stopped.
bool stopping_program_exists(uint32_t prog_id) {
  const int fd = bpf_prog_get_fd_by_id(prog_id);
  if (fd < 0) return errno != ENOENT;  // refused: count it as there, the deadline still ends the wait
  close(fd);                           // the last reference may be this one: closing it frees the program
  return true;
}

// Writes the guardian's name over the command line inherited from gpuscope, in place (the
// argument strings' memory, which /proc/PID/cmdline shows).
void rename_command_line() {
  char stat[1024];
  const int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const ssize_t n = read(fd, stat, sizeof(stat) - 1);
  close(fd);
  if (n <= 0) return;
  stat[n] = 0;
  // Fields 48 and 49, counted after the command name's closing parenthesis (field 2 ends it).
  const char* p = strrchr(stat, ')');
  if (!p) return;
  unsigned long field = 2, start = 0, end = 0;
  for (++p; *p && field < 49;) {
    if (*p != ' ') {
      ++p;
      continue;
    }
    ++field;
    ++p;
    if (field == 48 || field == 49) (field == 48 ? start : end) = strtoul(p, nullptr, 10);
  }
  if (!start || end <= start) return;
  char* area = reinterpret_cast<char*>(start);
  const size_t size = end - start;
  memset(area, 0, size);
  memcpy(area, kGuardianName, std::min(size - 1, sizeof(kGuardianName) - 1));
}

// The guardian's life: system calls only. It is forked from a process whose other threads may
// hold locks (malloc's) that no thread will release in it.
[[noreturn]] void guard(const StopMaps& maps, int pipe_read, uint32_t stop_prog_id) {
  // Whatever is sent to gpuscope's process group (Ctrl-C, SIGTERM) is for gpuscope: the guardian
  // outlives it by design, until the pipe's end.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, nullptr);
  // A name that `pkill gpuscope`, `pkill -f gpuscope` and `killall gpuscope` do not match: killed
  // with gpuscope, it could not continue what gpuscope held.
  prctl(PR_SET_NAME, kGuardianName, 0, 0, 0);
  rename_command_line();
  const int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, STDIN_FILENO);
    dup2(null, STDOUT_FILENO);
    if (null > STDERR_FILENO) close(null);
  }
  close_all_but(maps, pipe_read);
  // Stops are allowed only from here, by the guardian itself: were its pipe's end to come before
  // gpuscope had allowed them, nothing would turn them off again.
  const uint32_t key = 0, on = 1, off = 0;
  bpf_map_update_elem(maps.guard, &key, &on, BPF_ANY);
  // A byte before the end: gpuscope ended in order, having answered every stop it made.
  bool orderly = false;
  for (;;) {
    char byte;
    const ssize_t n = read(pipe_read, &byte, 1);
    if (n == 1) orderly = true;
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
  }
  bpf_map_update_elem(maps.guard, &key, &off, BPF_ANY);
  continue_unanswered(maps);
  if (orderly) {
    // Once more for a program that passed the check just before stops were turned off.
    sleep_ms(20);
    continue_unanswered(maps);
    _exit(0);
  }
  // gpuscope died. Stops are off for programs that start from now on, but one that passed the
  // check just before may list and stop its process after any given round. Keep answering until
  // the kernel has released the stopping program (the dead process's descriptors and links), and
  // half a second past that; never longer than kGiveUpMs.
  constexpr uint64_t kRoundMs = 20, kAfterReleaseMs = 500, kGiveUpMs = 30'000;
  const uint64_t start = now_ms();
  uint64_t released_at = 0;
  while (now_ms() - start < kGiveUpMs) {
    sleep_ms(kRoundMs);
    continue_unanswered(maps);
    if (!released_at && !stopping_program_exists(stop_prog_id)) released_at = now_ms();
    if (released_at && now_ms() - released_at >= kAfterReleaseMs) break;
  }
  _exit(0);
}

}  // namespace

StopGuardian::StopGuardian(int made_map_fd, int answered_map_fd, int guard_map_fd, uint32_t stop_prog_id) {
  const StopMaps maps{made_map_fd, answered_map_fd, guard_map_fd};
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("cannot start the stop guardian: pipe: {}", std::strerror(errno));
  pid_ = fork();
  if (pid_ < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    throw Error("cannot start the stop guardian: fork: {}", std::strerror(err));
  }
  if (pid_ == 0) guard(maps, fds[0], stop_prog_id);
  close(fds[0]);
  pipe_write_ = fds[1];
}

bool StopGuardian::alive() {
  if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
  return pid_ > 0;
}

StopGuardian::~StopGuardian() {
  if (pipe_write_ >= 0) {
    if (in_order_) [[maybe_unused]] auto n = write(pipe_write_, "o", 1);
    close(pipe_write_);
  }
  // Otherwise the guardian waits for this process's end (the stopping program's release): not
  // to be waited for here.
  if (pid_ > 0 && in_order_) {
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace gpuscope::attach
