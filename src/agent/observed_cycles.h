// A process's launch and copy counters while the budget duty-cycles its high-rate probes
// (budget.h): what the calls seen stand for, whether the counts are exact, and how far an
// estimate may be off.
//
// A cycle begins when the probes are switched on and ends at the next switch-on or at the
// process's exit. The calls seen in its on-period stand for the whole cycle as it was lived:
// each counts (on + off so far) / on, raised as the off-period passes (so counters keep rising
// at the rate last seen) and never past the exit. A process that exits while its probes are on
// is counted exactly; one that exits during an off-period, for the time it lived. No planned
// duty enters the count: a cycle cut short by an exit, or stretched by a late tick, weighs what
// it was. (Weighing by the planned duty counted a process that lived its whole life inside one
// on-period 1 / duty times: 2.5 times its 1,007 launches when the agent's own CPU budget had
// cut every duty to 0.39.)
//
// A process found at its start (its first CUDA library's load) makes no launch or copy while it
// starts up: CUDA creates its context (0.1-0.5 s on a GPU), a Python program imports its modules.
// That time, seen to hold none, stands for none: the on-period its first call falls in stands
// for its cycle from that call on. (Taken into the on-period's rate, a start-up of ~0.25 s cut an
// H100 program's 4,000 launches over 4 s to 3,223-3,476 estimated.)
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>

namespace gpuscope::agent {

struct CopyKey {
  std::string direction, host_memory;
  auto operator<=>(const CopyKey&) const = default;
};
struct CopyTotals {
  double count = 0, bytes = 0, seconds = 0;
};

// The series a process's high-rate calls go to.
struct HighRateCounts {
  static constexpr int64_t kOtherKernel = std::numeric_limits<int64_t>::min();  // past max_kernel_names
  std::unordered_map<int64_t, double> launches;  // kernel id (0: unnamed, -1: graph) -> count
  std::map<CopyKey, CopyTotals> copies;
  double calls = 0;  // launches and copies together: what the error bound is about
  // Adds `raw` scaled by `factor`.
  void add(const HighRateCounts& raw, double factor);
};

class ObservedCycles {
 public:
  // Records reach the agent up to a poll (100 ms) and a pipeline batch late: off-periods are
  // estimated up to this long ago, so that a process whose exit record is on its way is not
  // extrapolated past its exit. Once the exit is known they are estimated up to it.
  static constexpr uint64_t kRecordLagNs = 500'000'000;
  // Cycles kept for records that arrive after their cycle ended (and for the error bound's
  // neighbouring rates); older ones are folded into the totals.
  static constexpr size_t kCyclesKept = 4;
  // The observer effect counted in the bound is at most this share of the process's CPU.
  static constexpr double kMaxProbeShare = 0.95;

  // The budget took the process on at `t`; its probes are off until switched on. `at_start`: found
  // at its first CUDA library's load, so that it has made no call yet: until its first launch or
  // copy it is starting up (see the top of this file). Otherwise found running (at the agent's
  // start): its quiet times before its first call seen are a sample of its ways, and count.
  void found(uint64_t t, bool at_start = false);
  // Probes on at `t` (taken before attaching): the last cycle ends, its weight is final.
  void switched_on(uint64_t t, HighRateCounts& totals);
  // Probes off at `t` (taken after detaching returned). `probe_share`: the share of the
  // process's CPU time its high-rate probes took while on (a CPU-bound caller runs that much
  // slower while observed; see error_calls).
  void switched_off(uint64_t t, double probe_share);
  // The process exited at `t`: exactly then (its exit record), or by then at the latest.
  void exited(uint64_t t, bool exact);
  bool tracked() const { return found_; }

  // A call made at `ts`: the observed counts of the cycle it belongs to (null: not tracked) and
  // what each of its calls counts now.
  struct Slot {
    HighRateCounts* raw = nullptr;
    double weight = 1;
  };
  Slot slot(uint64_t ts);

  // Raises each cycle's weight to what it has lived by `now` (less kRecordLagNs, or the exit),
  // adding the difference to `totals`; then the figures below are as of that time.
  void advance(uint64_t now, HighRateCounts& totals);
  // Share of the time since found that the probes were on (1 before any time passed).
  double observed_ratio() const;
  // Every high-rate call made since the process was found was seen (counted once each).
  bool exact() const { return on_ns_ == span_ns_; }
  // Bound on how far totals.calls may be from the truth, in calls. For each off-period: the
  // calls it was credited with could differ from the truth by its length times the change in
  // rate between the on-periods before and after it (if the rate stayed between those two);
  // with no on-period after it yet (the process exited, or the next has not come), by all of
  // them. Plus the observer effect: a caller that spends its CPU making probed calls makes them
  // up to 1 / (1 - probe share) faster unobserved. 0 when exact.
  double error_calls() const { return error_calls_; }

 private:
  struct Cycle {
    // Switched on (attaching returned) and off (detaching began), each moved to a call seen
    // past it: the probes fire a little before the one and after the other.
    uint64_t start = 0;
    uint64_t off_at = 0;  // 0: not yet
    uint64_t end = 0;     // the next cycle's start (0: none yet)
    double probe_share = 0;
    double weight = 1;    // applied to raw so far
    uint64_t off_ns = 0;  // the off-period's length at the last raise
    uint64_t last_seen = 0;  // the latest call seen in it
    HighRateCounts raw;   // calls seen
  };
  // The cycle's on-time by `t`.
  static uint64_t on_ns(const Cycle& c, uint64_t t);
  // Of it, the time its calls stand for: from the end of the start-up, if that came later.
  uint64_t rate_ns(const Cycle& c, uint64_t t) const;
  double bound(const Cycle& c, const Cycle* next, uint64_t t) const;
  void raise(Cycle& c, uint64_t t, HighRateCounts& totals);

  bool found_ = false;
  bool starting_ = false;  // found at its start (the start-up lasts until first_call_)
  uint64_t first_ = 0;
  static constexpr uint64_t kNone = UINT64_MAX;
  uint64_t first_call_ = kNone;  // the earliest launch or copy seen since found
  uint64_t exit_ = 0;  // 0: alive
  bool exit_exact_ = false;
  uint64_t at_ = 0;  // the time of the last advance
  std::deque<Cycle> cycles_;
  // Cycles no longer kept: their on-time and error bound.
  uint64_t folded_on_ns_ = 0;
  double folded_error_ = 0;
  // As of the last advance.
  uint64_t on_ns_ = 0, span_ns_ = 0;
  double error_calls_ = 0;
};

}  // namespace gpuscope::agent
