// The reading end of the launch rings (inject/launch_ring.h): the rings of the processes that
// libgpuscope_launches.so was preloaded into, found by their announcements in one directory,
// mapped from /proc/PID/fd/FD, and drained in order. A ring's contents come from the traced
// process: every field is checked before it is used, and a ring that does not read as one is
// left alone (counted), never trusted.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "inject/launch_ring.h"

namespace gpuscope::record {

class LaunchRings {
 public:
  // `dir`: where the processes announce their rings (GPUSCOPE_LAUNCH_RING).
  explicit LaunchRings(std::string dir) : dir_(std::move(dir)) {}
  ~LaunchRings();
  LaunchRings(const LaunchRings&) = delete;
  LaunchRings& operator=(const LaunchRings&) = delete;

  // A private directory for the announcements, made under `parent` (created 0700).
  static std::string make_dir(const std::string& parent);

  // Maps the rings announced since the last call.
  void discover();
  // Hands each whole record not read yet to `on`, ring by ring, in each ring's order; returns how
  // many. The rings' tails move on, so the writers can reuse the slots.
  using OnLaunch = std::function<void(uint32_t pid, const gs_launch_record&)>;
  size_t drain(const OnLaunch& on);
  // A process that is gone: what it left is drained, its ring unmapped, its announcement removed.
  void forget(pid_t pid, const OnLaunch& on);

  size_t rings() const { return rings_.size(); }
  // Launches the writers could not write (their ring was full), over every ring read.
  uint64_t lost() const;
  // Announcements that could not be read or mapped, or mapped but did not hold a ring.
  uint64_t refused() const { return refused_; }
  const std::string& dir() const { return dir_; }

  // A ring already mapped (tests: recorded bytes), `bytes` long, as process `pid`'s.
  bool adopt(pid_t pid, void* mapping, size_t bytes, bool owned);

 private:
  struct Ring {
    gs_launch_ring_header* header = nullptr;
    size_t bytes = 0;
    uint64_t read = 0;   // next position to read
    bool owned = false;  // unmapped here
    std::string announcement;
  };
  size_t drain_one(pid_t pid, Ring& r, const OnLaunch& on);
  void release(Ring& r);

  std::string dir_;
  std::map<pid_t, Ring> rings_;
  uint64_t lost_gone_ = 0;  // of rings forgotten
  uint64_t refused_ = 0;
};

}  // namespace gpuscope::record
