// Who keeps something per process, and must let go of it when the process exits or runs a new
// program. Each owner subscribes once; the one place that learns of the exit (from its record)
// tells them all. Two of these exist, one per thread that keeps per-process state: the
// pipeline's (caches tied to the record order: a process's last records come before its exit)
// and the control loop's (probes, unwind tables, the agent's budget: told as soon as the ring
// buffer sees the exit).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace gpuscope::record {

class ProcessLifetime {
 public:
  // ts_ns: the exit's or the exec's, from its record (0 where a sweep of /proc found it gone).
  using Handler = std::function<void(uint32_t pid, uint64_t ts_ns)>;

  // The process is gone; its pid may be reused by an unrelated process.
  void on_exit(Handler h) { exit_.push_back(std::move(h)); }
  // The process runs a new program: its addresses mean other code from here on.
  void on_exec(Handler h) { exec_.push_back(std::move(h)); }

  void exited(uint32_t pid, uint64_t ts_ns) const {
    for (const auto& h : exit_) h(pid, ts_ns);
  }
  void executed(uint32_t pid, uint64_t ts_ns) const {
    for (const auto& h : exec_) h(pid, ts_ns);
  }
  bool wants_exits() const { return !exit_.empty(); }

 private:
  std::vector<Handler> exit_, exec_;
};

}  // namespace gpuscope::record
