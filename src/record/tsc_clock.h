// CLOCK_MONOTONIC nanoseconds from the CPU's time-stamp counter, for the launch rings of processes
// whose hooks time their launches with rdtsc (inject/launch_ring.h, GS_LAUNCH_CLOCK_TSC: a read
// costs half what clock_gettime does). The hooks do so only where the kernel's clock source is the
// TSC, so the counter is the same on every CPU and runs at one rate.
//
// The conversion is linear from the latest of the pairs (counter, nanoseconds) read back to back
// here, at the rate measured from the first pair to the latest: sample() at every reading of the
// rings keeps each record within milliseconds of a pair, where the rate's error (parts per
// million, less as the interval grows) is under a microsecond.
#pragma once

#include <cstdint>

namespace gpuscope::record {

class TscClock {
 public:
  TscClock() { sample(); }
  // Reads a new pair.
  void sample();
  uint64_t to_ns(uint64_t tsc) const;
  // A span of ticks in nanoseconds.
  uint64_t span_ns(uint64_t ticks) const;
  double ns_per_tick() const { return ns_per_tick_; }

  static uint64_t read_tsc();

 private:
  struct Pair {
    uint64_t tsc = 0, ns = 0;
  };
  static Pair read_pair();
  Pair first_, last_;
  // Until two pairs lie apart enough to measure it: a nominal 1 GHz is never used, as sample()
  // at construction waits for a first measure.
  double ns_per_tick_ = 1.0;
};

}  // namespace gpuscope::record
