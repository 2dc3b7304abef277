// Address → (file, file offset) for the processes being recorded, from /proc/PID/maps.
// Snapshots are taken while processes run (at library loads, on first sight, on a miss) so
// that the record file can name frames after the processes are gone. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "discover/proc.h"

namespace gpuscope::symbolize {

struct ModuleAddress {
  std::string path;       // as the process sees it
  std::string open_path;  // through the process's root (/proc/PID/root/...), or `path` once it is gone
  uint64_t file_offset = 0;
};

// Where gpuscope can open a file a process maps: through the process's root while it runs,
// or, once it is gone with its root, the same path in ours (build ids tell a report whether
// that guess was right).
std::string openable_path(pid_t pid, const std::string& path);
// The same, by a path that stays good once the process is gone where there is one: the mapping's
// path in our root when that names the same file (its device and inode), else openable_path's.
// For readers that open files later, when the process may have exited (libdw opens a module's
// file at the first walk that needs it).
std::string lasting_path(pid_t pid, const discover::Mapping& m);

class ProcessMaps {
 public:
  // Reads the maps now; false if the process is gone.
  bool refresh(pid_t pid);
  // Resolves addr; on a miss, refreshes once if a file maps it now (a library loaded since),
  // asked of the kernel (PROCMAP_QUERY) where it can say, else at most every 20 ms to 2 s.
  std::optional<ModuleAddress> resolve(pid_t pid, uint64_t addr);
  void forget(pid_t pid);
  // Forgets the snapshot only if it was taken before ts_ns (CLOCK_MONOTONIC): at an exec seen
  // late, a snapshot taken since (at a library load) already shows the new program.
  void forget_before(pid_t pid, uint64_t ts_ns);
  // The last snapshot of the process's file mappings, sorted by address, paths as it sees them
  // (refreshed first when it is alive); empty if none was ever taken.
  std::vector<discover::Mapping> mappings(pid_t pid);
  // How many times /proc/PID/maps was read (all processes).
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }

 private:
  struct Process {
    std::vector<discover::Mapping> maps;
    uint64_t refreshed_ns = 0;
    uint64_t miss_refresh_interval_ns = 0;  // 0: the shortest (see kMinRefreshIntervalNs)
    uint64_t yes_refresh_page = 0;  // the page a file maps that the last read at once was for
    // openable_path's recent answers, by path: (answer, when asked).
    std::unordered_map<std::string, std::pair<std::string, uint64_t>> open_paths;
    // Pages the kernel said no file maps (the vDSO, JIT code), until the next read of the maps:
    // samples stop there often, and each question costs an open, an ioctl and a close.
    std::unordered_set<uint64_t> no_file_pages;
  };
  static constexpr size_t kMaxNoFilePages = 4096;
  std::optional<ModuleAddress> lookup(pid_t pid, uint64_t addr);
  mutable std::mutex mu_;
  std::unordered_map<pid_t, Process> processes_;  // those whose maps were read
  std::atomic<uint64_t> reads_{0};
};

}  // namespace gpuscope::symbolize
