// --stack-budget: keeps what walking the stacks of launches, copies and memsets (the calls that
// come by the thousand a second) adds to each process within a share of its elapsed time.
//
// The BPF side times each of those walks per process (bpf: stack_costs) and takes the stacks of
// one call in N, at random, N being the process's entry in stack_rates (none: every call). Each
// taken stack carries its N, so that flame graphs and the report count it N times. This class
// decides N from the walks' cost; it touches no map itself, so that the rules are tested
// without a kernel.
//
// Elapsed time, not CPU time, is the measure: a walk delays the thread that made the call, and
// the threads of a training step wait on each other, so what all of a process's walks cost,
// summed, bounds what they add to its step. A process's walks cost about share * N of its time
// when every stack is taken while one in N is; N is raised at once when that is over the budget,
// lowered by at most a quarter an interval when it is well under, and kept in between (a walk
// costs more when walks are further apart, so estimates taken at a large N are high).
//
// The budget counts the walks only: deciding whether to walk, and the caches the walks leave
// cold for the calls after them, cost the process too (a third to a half again of the walks'
// time on the H100's training step), which is why record's default budget is 0.5%
// (docs/performance.md).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>

namespace gpuscope::record {

class StackBudget {
 public:
  static constexpr uint64_t kIntervalNs = 100'000'000;  // N is decided anew this often at most ...
  // ... and first this soon after the first walk: a launch loop pays for every stack until then.
  static constexpr uint64_t kFirstIntervalNs = 20'000'000;
  // How often the owner should read the walks' cost (Tracer::poll_ms).
  static constexpr int kPollMs = 20;
  static constexpr uint32_t kMaxEvery = 1u << 16;
  // Aim below the budget by this factor, so that the noise of one interval does not cross it.
  static constexpr double kHeadroom = 1.25;
  // Lower N only once the walks use less than budget / kLowerBelow.
  static constexpr double kLowerBelow = 1.5;

  explicit StackBudget(double budget) : budget_(budget) {}
  double budget() const { return budget_; }

  // A process's walks' cost so far (the BPF counters: nanoseconds and walks, since its first walk
  // at first_walk_ns), read at now_ns, as often as wanted: decisions are spaced by the intervals
  // above, the first counted from the first walk. Returns the process's new N when it changes.
  std::optional<uint32_t> observe(pid_t pid, uint64_t now_ns, uint64_t walk_ns, uint64_t walks,
                                  uint64_t first_walk_ns);
  void forget(pid_t pid) { processes_.erase(pid); }

  struct Process {
    uint32_t every = 1;      // N now
    uint32_t max_every = 1;  // the largest N it had
    uint64_t first_ns = 0, last_ns = 0;  // its first walk; the last decision
    uint64_t last_walk_ns = 0, last_walks = 0;  // the counters at the last decision
    uint64_t changes = 0;  // times N changed
    uint64_t decisions = 0;
    // The walks' share of the process's elapsed time since first seen.
    double share() const {
      return last_ns > first_ns ? double(last_walk_ns) / double(last_ns - first_ns) : 0;
    }
  };
  const std::map<pid_t, Process>& processes() const { return processes_; }

 private:
  double budget_;
  std::map<pid_t, Process> processes_;
};

}  // namespace gpuscope::record
