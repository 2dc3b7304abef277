// The BPF side stops a process at its first CUDA library's load (SIGSTOP) so that the library's
// probes are in place before its code runs; user space continues it once they are. If gpuscope
// dies between the two (kill -9, a crash, the OOM killer), nothing would continue it: the
// process, possibly one gpuscope only looked at (--all), would stay stopped for good.
//
// The guardian is a small process forked at start that holds the BPF maps of the stops made
// (stops_made: the BPF side counts a process's stop before making it) and answered
// (stops_answered: user space notes each after its SIGCONT), the map that allows stopping
// (stop_guard), and a pipe whose write end only gpuscope holds. When gpuscope is gone, however it
// went, the kernel closes that end; the guardian reads end-of-file, forbids further stops (the
// probes stay attached for a while as the kernel releases a dead gpuscope's links, and would go
// on stopping processes that load a CUDA library), sends SIGCONT to every process with a stop
// not answered, and goes on doing so every 20 ms until
// the kernel has released the program that stops processes and half a second past that (a
// program that passed the check just before may stop its process after any one round), then
// exits. The BPF side stops nothing until the guardian runs. When gpuscope ends in order, having
// answered every stop, it says so before closing the pipe and the guardian exits at once.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace gpuscope::attach {

// The guardian's process name (and command line).
inline constexpr char kGuardianName[] = "gs-guardian";

class StopGuardian {
 public:
  // Forks the guardian, which keeps the three maps and watches for the release of the program
  // `stop_prog_id`. Throws Error if it cannot be started.
  StopGuardian(int made_map_fd, int answered_map_fd, int guard_map_fd, uint32_t stop_prog_id);
  // Closes the pipe. After ended_in_order(), waits for the guardian's last rounds (20 ms);
  // otherwise leaves it to answer stops until this process's probes are released.
  ~StopGuardian();
  // Every stop made has been answered and none can be made any more (the stopping program is
  // detached).
  void ended_in_order() { in_order_ = true; }
  StopGuardian(const StopGuardian&) = delete;
  StopGuardian& operator=(const StopGuardian&) = delete;

  pid_t pid() const { return pid_; }
  // False once the guardian has exited (reaped here): killed, since it ends only after this
  // process.
  bool alive();

 private:
  pid_t pid_ = -1;
  int pipe_write_ = -1;
  bool in_order_ = false;
};

}  // namespace gpuscope::attach
