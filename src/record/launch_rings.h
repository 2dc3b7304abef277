// The reading end of the launch rings (inject/launch_ring.h): the rings of the processes that
// libgpuscope_launches.so was preloaded into, received on a socket in one directory (their
// memfds, sent with SCM_RIGHTS) or claimed from a process that keeps its ring in standby,
// mapped, and drained in order, with the names of the functions they launch. A ring's contents come from the
// traced process: every field is checked before it is used, and a ring that does not read as one
// is left alone (counted), never trusted.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "discover/proc.h"
#include "events.h"
#include "inject/launch_ring.h"
#include "record/tsc_clock.h"

namespace gpuscope::record {

class LaunchRings {
 public:
  // `dir`: where the processes send their rings (GPUSCOPE_LAUNCH_RING); its socket is made here
  // (throws Error if it cannot be).
  explicit LaunchRings(std::string dir);
  ~LaunchRings();
  LaunchRings(const LaunchRings&) = delete;
  LaunchRings& operator=(const LaunchRings&) = delete;

  // A private directory for the announcements, made under `parent` (created 0700).
  static std::string make_dir(const std::string& parent);

  // Maps the rings sent since the last call.
  void discover();
  // A process's ring in standby (the library preloaded by the service's owner, not by gpuscope),
  // opened through /proc/PID/map_files: claimed for this gpuscope and switched on; its launches
  // from now on are read (those before are not), and at forget() or the end it is paused and
  // its claim given back. Taken: another live gpuscope (`reader`) reads it. It hands no launch
  // over for its stack until set_stack_every.
  enum class Claim { Claimed, NoRing, Taken, Refused };
  // `maps`: the process's (discover::read_maps).
  Claim claim(pid_t pid, const std::vector<discover::Mapping>& maps, uint32_t* reader = nullptr);
  // The mapping of a process's ring among its `maps`; null if none.
  static const discover::Mapping* standby_ring(const std::vector<discover::Mapping>& maps);
  // The names the processes give the functions they launch, handed to `on` by drain and forget
  // before the launches read with them. Set before the first drain.
  using OnName = std::function<void(uint32_t pid, uint64_t function, std::string_view name)>;
  void on_name(OnName on) { on_name_ = std::move(on); }
  // Hands each whole record not read yet to `on`, ring by ring, in each ring's order; returns how
  // many. The rings' tails move on, so the writers can reuse the slots. A live ring's reading
  // stops at its first record made after `upto_ns` (a call entered then), so that the probes'
  // events from before it can be handled first.
  using OnLaunch = std::function<void(uint32_t pid, const gs_launch_record&)>;
  size_t drain(const OnLaunch& on, uint64_t upto_ns = UINT64_MAX);
  // A process that is gone: what it left is drained, its ring unmapped, its announcement removed.
  void forget(pid_t pid, const OnLaunch& on);
  // Times a record of process `pid`'s ring carries in CLOCK_MONOTONIC nanoseconds, as drain
  // hands them out (a launch handed to gpuscope_launch_stack comes through its probe); false if
  // the process has no ring here.
  bool times_to_ns(pid_t pid, gs_launch_record& r) const;

  size_t rings() const;
  // Every process whose ring was received.
  std::set<pid_t> received() const;
  // The N of one launch in N whose stack the process's hooks hand to the probe (0: none); any
  // thread. Rings received later start at `initial_stack_every`.
  void set_stack_every(pid_t pid, uint32_t every);
  void set_initial_stack_every(uint32_t every) { initial_stack_every_ = every; }
  // Launches the writers could not write (their ring was full), over every ring read.
  uint64_t lost() const;  // any thread
  // Names read, and names the processes could not write (their names' area was full).
  uint64_t names() const { return names_.load(std::memory_order_relaxed); }
  uint64_t names_lost() const;
  // Rings sent that could not be mapped, or did not hold a ring of the process that sent them.
  uint64_t refused() const { return refused_; }
  const std::string& dir() const { return dir_; }

  // The call record gpuscope's driver probes would have made of the launch (the thread's name
  // `comm`); false if the entry point is not one gpuscope knows.
  static bool to_call_record(uint32_t pid, const gs_launch_record& r, const std::string& comm, gs_call_record& out);

  // A ring already mapped (tests: recorded bytes), `bytes` long, as process `pid`'s.
  bool adopt(pid_t pid, void* mapping, size_t bytes, bool owned);

 private:
  struct Ring {
    gs_launch_ring_header* header = nullptr;
    size_t bytes = 0;
    uint64_t read = 0;   // next position to read
    uint64_t mask = 0;   // slots - 1, as checked at adopt (never the header's later word)
    uint32_t clock = GS_LAUNCH_CLOCK_MONOTONIC;  // as checked at adopt
    bool owned = false;  // unmapped here
    // The names' area, as checked at adopt, and the next entry to read (broken: an entry that
    // does not read as one, after which none is read).
    uint64_t names_at = 0, names_bytes = 0, names_read = 0;
    bool names_broken = false;
    // Claimed from standby: its launches before `since_ns` are not this recording's, nor its
    // losses before (`lost_before`); paused and given back at the end.
    bool claimed = false;
    uint64_t since_ns = 0;
    uint64_t lost_before = 0;
  };
  Ring* adopt_locked(pid_t pid, void* mapping, size_t bytes, bool owned);
  size_t drain_one(pid_t pid, Ring& r, const OnLaunch& on, uint64_t upto_ns = UINT64_MAX);
  void read_names(pid_t pid, Ring& r);
  uint64_t lost_of(const Ring& r) const;
  // The ring's last reading is done: a claimed one is paused and its claim given back.
  void let_go(Ring& r);
  void to_ns(uint32_t clock, gs_launch_record& r) const;
  void release(Ring& r);

  void receive();
  // Every method takes it: the ring-buffer thread drains, the control thread sets N.
  mutable std::mutex mu_;
  std::atomic<uint32_t> initial_stack_every_{0};
  TscClock tsc_;  // sampled at each drain
  std::string dir_;
  int socket_ = -1;
  std::map<pid_t, Ring> rings_;
  uint64_t lost_gone_ = 0;  // of rings forgotten
  uint64_t names_lost_gone_ = 0;
  std::atomic<uint64_t> names_{0};
  OnName on_name_;
  uint64_t refused_ = 0;
  std::set<pid_t> received_;
  // Rings of a process's earlier image (before an exec), drained once more and let go.
  std::vector<std::pair<pid_t, Ring>> retired_;
};

}  // namespace gpuscope::record
