#include "record/tsc_clock.h"

#include <time.h>
#include <x86intrin.h>

namespace gpuscope::record {

namespace {
uint64_t monotonic_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}
// Pairs closer together than this measure the rate too roughly to replace a rate already known.
constexpr uint64_t kMinRateSpanNs = 1'000'000;
}  // namespace

uint64_t TscClock::read_tsc() { return __rdtsc(); }

TscClock::Pair TscClock::read_pair() {
  // The clock read between two counter reads, the tightest of a few: the pair's counter is the
  // middle of the two.
  Pair best;
  uint64_t best_gap = UINT64_MAX;
  for (int i = 0; i < 4; ++i) {
    const uint64_t a = __rdtsc();
    const uint64_t ns = monotonic_now();
    const uint64_t b = __rdtsc();
    if (b - a < best_gap) {
      best_gap = b - a;
      best = {a + (b - a) / 2, ns};
    }
  }
  return best;
}

void TscClock::sample() {
  const Pair p = read_pair();
  if (!first_.tsc) {
    first_ = p;
    // A first rate, from pairs 2 ms apart (a few microseconds of error a millisecond at first:
    // each later sample measures it over a longer span).
    timespec pause{0, 2'000'000};
    nanosleep(&pause, nullptr);
    last_ = read_pair();
  } else {
    last_ = p;
  }
  if (last_.ns > first_.ns + kMinRateSpanNs && last_.tsc > first_.tsc)
    ns_per_tick_ = double(last_.ns - first_.ns) / double(last_.tsc - first_.tsc);
}

uint64_t TscClock::to_ns(uint64_t tsc) const {
  const double d = (double(int64_t(tsc - last_.tsc))) * ns_per_tick_;
  const int64_t ns = int64_t(last_.ns) + int64_t(d);
  return ns > 0 ? uint64_t(ns) : 0;
}

uint64_t TscClock::span_ns(uint64_t ticks) const { return uint64_t(double(ticks) * ns_per_tick_); }

}  // namespace gpuscope::record
