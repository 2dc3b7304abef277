// The BPF side stops a process at its first CUDA library's load (SIGSTOP) so that the library's
// probes are in place before its code runs; user space continues it once they are. If gpuscope
// dies between the two (kill -9, a crash, the OOM killer), nothing would continue it: the
// process, possibly one gpuscope only looked at (--all), would stay stopped for good.
//
// The guardian is a small process forked at start that holds the BPF map of the processes held
// stopped (stopped_held: the BPF side adds a process before stopping it, user space deletes it as
// it continues it), the map that allows stopping (stop_guard), and a pipe whose write end only
// gpuscope holds. When gpuscope is gone, however it went, the kernel closes that end; the
// guardian reads end-of-file, forbids further stops (the probes stay attached for seconds while
// the kernel releases a dead gpuscope's links, and would go on stopping processes that load a
// CUDA library), sends SIGCONT to every process listed, and again over the next seconds (a
// program that passed the check just before, a SIGSTOP delivered after the first SIGCONT), then
// exits. The BPF side stops nothing until the guardian runs.
#pragma once

#include <sys/types.h>

namespace gpuscope::attach {

class StopGuardian {
 public:
  // Forks the guardian, which keeps `held_map_fd` and `guard_map_fd`. Throws Error if it cannot
  // be started.
  StopGuardian(int held_map_fd, int guard_map_fd);
  // Closes the pipe and waits for the guardian, which continues any process still listed.
  ~StopGuardian();
  StopGuardian(const StopGuardian&) = delete;
  StopGuardian& operator=(const StopGuardian&) = delete;

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int pipe_write_ = -1;
};

}  // namespace gpuscope::attach
