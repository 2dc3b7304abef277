// CLOCK_MONOTONIC in nanoseconds: the clock of every timestamp gpuscope records (bpf_ktime_get_ns
// reads the same one). Header-only, so that the injection library can use it too.
#pragma once

#include <time.h>

#include <cstdint>

namespace gpuscope {

inline uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

inline uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }

// Wall-clock time since the epoch: what exported series and profiles are stamped with.
inline uint64_t realtime_ns() { return clock_ns(CLOCK_REALTIME); }

}  // namespace gpuscope
