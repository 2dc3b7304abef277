// The overhead budget: keeps what each process's probes add to its CPU time under a share of
// that time, by duty-cycling its high-rate probes (launches, copies, memsets) while the
// low-rate ones (allocations, frees, syncs, module loads) stay on.
//
// It estimates a process's probe cost from its hit counts and what one hit costs on this
// machine (measured at start), compares it with the CPU time /proc says the process used while
// its probes were on, and sets the share of each cycle they are on:
//   duty = budget * CPU time while on / probe cost while on      (between kMinDuty and 1)
// The calls seen in an on-period stand for its cycle as it was lived (observed_cycles.h); the
// series say which share was observed, whether the counts are exact, and how far off they may be.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>

#include "agent/aggregator.h"

namespace gpuscope::agent {

struct BudgetConfig {
  double budget = 0.005;          // share of the process's CPU time; 1 (or more): no limit
  double entry_hit_ns = 0;        // an entry-only probe hit (uprobe)
  double return_hit_ns = 0;       // a call probed at entry and return (uprobe + uretprobe)
  // High-rate probes are on for duty * cycle_s of each cycle. Short, so that the live diagnosis
  // sees whole steps within seconds of any moment (steps across an off-period are not analysed).
  double cycle_s = 2;
  double min_on_s = 0.2;          // shorter on-periods are not worth their attach cost
};

class BudgetController {
 public:
  // `switch_probes(pid, on, all_functions)` attaches or removes a process's high-rate probes;
  // false if that failed. Switching on with `all_functions` false, only the functions the
  // process was seen calling need probes (see kAllFunctionsEvery).
  using SwitchFn = std::function<bool(pid_t, bool on, bool all_functions)>;
  // A process's CPU time so far (process_cpu_ns; tests give a clock of their own).
  using CpuClock = std::function<uint64_t(pid_t)>;
  BudgetController(const BudgetConfig& cfg, Aggregator& agg, SwitchFn switch_probes, CpuClock cpu_ns = {});

  void set_budget(double budget) { cfg_.budget = budget; }
  // What a hit costs, as measured since start: the trap (calibrated) and the probe programs.
  void set_hit_costs(double entry_ns, double return_ns) {
    cfg_.entry_hit_ns = entry_ns;
    cfg_.return_hit_ns = return_ns;
  }
  // The agent's own CPU budget: every observed call costs the agent CPU time, so when observing
  // them takes more than `budget` of a core (`share`: the agent's CPU spent on high-rate calls'
  // records, measured), every process's duty is scaled down by the same factor; it recovers
  // slowly once the agent is back under.
  void note_agent_cpu(double share, double budget);
  double agent_factor() const { return agent_factor_; }
  const BudgetConfig& config() const { return cfg_; }
  // A process whose first CUDA library was just probed: its high-rate probes start on.
  // `at_start`: taken on at its first CUDA library's load, before it could make a call (its
  // start-up stands for none of its calls: observed_cycles.h); false: found running.
  void add_process(pid_t pid, uint64_t now_ns, bool at_start = false);
  // A process that exited by `now_ns` (0: when is not known; its exit record will say).
  void remove_process(pid_t pid, uint64_t now_ns = 0);
  // Re-estimates each process's duty and switches probes where a cycle's phase says so.
  void tick(uint64_t now_ns);
  // When the next planned switch is due (CLOCK_MONOTONIC; UINT64_MAX: none): the caller ticks
  // then, so that on-periods last what the duty plans, not up to a poll interval more.
  uint64_t next_switch_ns() const;

  struct ProcessState {
    bool on = true;
    double duty = 1;
    uint64_t phase_start_ns = 0;       // when the current on- or off-period began
    double off_len_s = 0;              // the current off-period's length, set at the switch-off
    uint64_t first_ns = 0, on_ns = 0;  // tracked since; of which high-rate probes were on
    uint64_t last_tick_ns = 0, last_cpu_ns = 0;
    ProbeHits last_hits;
    double cpu_ns_total = 0;    // the process's CPU time while tracked
    double added_ns_total = 0;  // estimated probe cost in that time
    // Since the last estimate of the duty: on-time and the CPU time in it; all CPU time; the
    // cost of high-rate hits (whenever their records arrive: some come after the switch-off)
    // and of the always-on probes' hits.
    uint64_t acc_on_wall_ns = 0;
    uint32_t on_periods = 0;  // switched on since tracked
    bool estimated = false;  // the duty was estimated once
    double probe_share = 0;  // the high-rate probes' cost over the CPU time while on, at the last estimate
    double acc_on_cpu_ns = 0, acc_cpu_ns = 0, acc_high_added_ns = 0, acc_low_added_ns = 0;
    double observed_ratio() const;
  };
  const std::map<pid_t, ProcessState>& processes() const { return state_; }
  // Counts processes added and removed and duties changed: the exported series follow at once.
  uint64_t changes() const { return changes_; }
  // gpuscope_probe_overhead_ratio: each process's estimated probe cost over its CPU time so far.
  MetricFamily overhead_family(Aggregator& agg) const;

 private:
  // At least one on-period (min_on_s) per 100 of them: counters must move within minutes, and
  // a process costlier than that shows it in gpuscope_probe_overhead_ratio.
  static constexpr double kMinDuty = 0.01;
  static constexpr double kMinAgentFactor = 0.05;
  // On-time after which a process far over its budget is cut back, before a full estimate.
  static constexpr uint64_t kEarlyEstimateNs = 200'000'000;
  // Every high-rate function is probed in the first on-period and in every 4th after it, the
  // rest probe those the process was seen calling: a function it starts calling is found within
  // four cycles (8 s at the 2 s cycle). Attaching and removing ~100 probes a cycle, most never
  // hit, took the larger part of the agent's CPU (dev VM, perf: TLB flushes of the probes'
  // writes into the process).
  static constexpr uint32_t kAllFunctionsEvery = 4;
  double hits_cost_ns(uint64_t entries, uint64_t returns) const;
  // The share of the cycle a process's high-rate probes are on: its duty, the agent's factor.
  double duty_now(const ProcessState& st) const;

  BudgetConfig cfg_;
  double agent_factor_ = 1;  // applied to every process's duty (see note_agent_cpu)
  Aggregator& agg_;
  SwitchFn switch_;
  CpuClock cpu_ns_;
  std::map<pid_t, ProcessState> state_;
  uint64_t changes_ = 0;
  // Processes gone, with their final estimate: exported while their other series still are.
  mutable std::map<pid_t, double> exited_ratio_;
};

// CPU time (user + system, all threads) a process has used, in nanoseconds; 0 if it is gone.
uint64_t process_cpu_ns(pid_t pid);

// The share of a core the agent spent on observed high-rate calls over `seconds`: the CPU time of
// its threads that read, decode and export records (all but the main one, which attaches,
// switches probes and looks at each new program: `reading_cpu_s`), in the share of the `records`
// read that were such calls (`high_rate_calls`). What BudgetController::note_agent_cpu weighs:
// the rest of the agent's work (processes starting and exiting on the node, NVML) does not
// shrink with the duty.
double observing_share(double reading_cpu_s, double seconds, uint64_t records, uint64_t high_rate_calls);

}  // namespace gpuscope::agent
