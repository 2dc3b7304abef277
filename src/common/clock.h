// CLOCK_MONOTONIC in nanoseconds: the clock of every timestamp gpuscope records (bpf_ktime_get_ns
// reads the same one). Header-only, so that the injection library can use it too.
#pragma once

#include <time.h>

#include <cmath>
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

// The time `seconds` after `now_ns`, for a --duration: 0 (none) for 0; saturated short of
// UINT64_MAX for what the clock cannot reach (1e12 s, inf), which converted as is overflowed into a
// deadline already past. NaN and negative values are refused where they are parsed.
inline uint64_t deadline_after_ns(uint64_t now_ns, double seconds) {
  if (!(seconds > 0)) return 0;
  const double until = double(now_ns) + seconds * 1e9;
  constexpr double kLatest = 9.0e18;  // ~285 years of uptime
  return until >= kLatest ? uint64_t(kLatest) : uint64_t(until);
}

}  // namespace gpuscope
