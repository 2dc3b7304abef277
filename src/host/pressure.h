// Pressure stall information and CPU quota throttling, read from /proc/pressure and the cgroups of
// the processes watched, a few times a second: the host's and each job's share of time stalled
// on CPU, memory and I/O, and the periods its CPU quota throttled it. Cumulative counters, as the
// kernel keeps them; the diagnosis takes differences.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/stop_signal.h"

namespace gpuscope::host {

struct PressureReading {
  uint64_t ts_ns = 0;  // CLOCK_MONOTONIC
  uint32_t pid = 0;    // 0: the host (/proc/pressure); else a watched process, for its cgroup
  std::string cgroup;  // its cgroup's path ("" for the host)
  // Microseconds stalled, cumulative: `some` (a task stalled), `full` (all non-idle tasks stalled).
  std::optional<uint64_t> cpu_some_us, memory_some_us, memory_full_us, io_some_us, io_full_us;
  // cpu.stat: quota periods, those throttled, time throttled (µs).
  std::optional<uint64_t> periods, throttled_periods, throttled_us;
  // Page-cache pages read back soon after they were evicted (workingset_refault_file of
  // /proc/vmstat or the cgroup's memory.stat), cumulative: the page cache is too small for what
  // the job reads again.
  std::optional<uint64_t> refault_file;
  // TCP segments sent and retransmitted in the network namespace (/proc/PID/net/snmp; the host's
  // for pid 0), cumulative: a lossy or congested path to a remote data source.
  std::optional<uint64_t> tcp_out_segs, tcp_retrans_segs;
};

// A "some avg10=.. total=N\nfull ... total=M" file: the two totals (µs).
std::pair<std::optional<uint64_t>, std::optional<uint64_t>> parse_pressure(const std::string& text);
// /proc/net/snmp's text: TCP's OutSegs and RetransSegs.
std::optional<std::pair<uint64_t, uint64_t>> parse_tcp_segments(const std::string& text);
// The cgroup of a process, from /proc/PID/cgroup's text: its path and whether it is v2's. `unified`:
// v2 is mounted at /sys/fs/cgroup (else v1's cpu controller is read, as on hosts that mount v2
// beside v1 at /sys/fs/cgroup/unified).
std::optional<std::pair<std::string, bool>> parse_cgroup(const std::string& text, bool unified);

class PressureSampler {
 public:
  using Sink = std::function<void(std::vector<PressureReading>&&)>;
  // Whether the host has PSI (/proc/pressure/cpu).
  static bool available();
  // Reads the host, and the cgroup of each watched process (processes sharing one are read once).
  std::vector<PressureReading> sample_once();
  void watch(pid_t pid, bool on);
  void start(double hz, Sink sink);
  void stop();
  ~PressureSampler() { stop(); }

 private:
  std::mutex mu_;
  std::vector<pid_t> pids_;
  std::map<pid_t, std::pair<std::string, bool>> cgroups_;  // pid -> its cgroup, read once
  StopSignal stop_;
  std::thread thread_;
};

}  // namespace gpuscope::host
