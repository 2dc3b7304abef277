#include "agent/budget.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/log.h"

namespace gpuscope::agent {
namespace {

// Nanoseconds since `since`: where in a tick (or a call) a switch happened, added to the
// caller's `now` so that switch times stay in the caller's clock.
uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count());
}

}  // namespace

uint64_t process_cpu_ns(pid_t pid) {
  // Read every tick (10 times a second) for each process under the budget, so from the
  // process's CPU clock: one system call and exact to the nanosecond. /proc/PID/stat cost
  // ~10x as much (open, format, close: 7% of the agent's CPU on the H100 soak) and moves in
  // 10 ms ticks. The clock id is the kernel's encoding of the process's CPUCLOCK_SCHED clock
  // (what clock_getcpuclockid returns, without its extra clock_getres call).
  if (pid <= 0) return 0;
  const clockid_t clock = static_cast<clockid_t>((~static_cast<unsigned>(pid) << 3) | 2);
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return 0;  // gone
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

double observing_share(double reading_cpu_s, double seconds, uint64_t records, uint64_t high_rate_calls) {
  // Records are taken as costing alike. Beside two shell loops starting /bin/true and ls, the
  // agent spent 8% of a core (5% in these threads) on their exec, fork and exit records; the
  // whole of it once cut every process's duty to the 5% floor, saving nothing and turning exact
  // counts into estimates.
  if (seconds <= 0 || records == 0) return 0;
  return reading_cpu_s / seconds * std::min(1.0, double(high_rate_calls) / double(records));
}

double BudgetController::ProcessState::observed_ratio() const {
  const uint64_t span = last_tick_ns > first_ns ? last_tick_ns - first_ns : 0;
  return span ? std::min(1.0, double(on_ns) / double(span)) : 1.0;
}

BudgetController::BudgetController(const BudgetConfig& cfg, Aggregator& agg, SwitchFn switch_probes, CpuClock cpu_ns)
    : cfg_(cfg), agg_(agg), switch_(std::move(switch_probes)), cpu_ns_(cpu_ns ? std::move(cpu_ns) : process_cpu_ns) {}

double BudgetController::hits_cost_ns(uint64_t entries, uint64_t returns) const {
  const double with_return = double(std::min(returns, entries));
  return (double(entries) - with_return) * cfg_.entry_hit_ns + with_return * cfg_.return_hit_ns;
}

double BudgetController::duty_now(const ProcessState& st) const {
  // budget >= 1: nothing is limited, the agent's own CPU budget included.
  return cfg_.budget >= 1 ? 1.0 : std::clamp(st.duty * agent_factor_, kMinDuty, 1.0);
}

void BudgetController::add_process(pid_t pid, uint64_t now_ns, bool at_start) {
  if (state_.contains(pid)) return;
  ProcessState st;
  // The process is observed from when its probes are live: once attaching returned (5-12 ms
  // on the dev VM). Calls before that are not counted, as calls before its library's load was
  // seen are not.
  const auto attach_start = std::chrono::steady_clock::now();
  st.on = switch_(pid, true, true);
  st.on_periods = 1;
  const uint64_t live_ns = now_ns + elapsed_ns(attach_start);
  agg_.high_rate_found(uint32_t(pid), live_ns, at_start);
  if (st.on) agg_.high_rate_switched_on(uint32_t(pid), live_ns);
  st.phase_start_ns = st.first_ns = st.last_tick_ns = now_ns;
  st.last_cpu_ns = cpu_ns_(pid);
  auto hits = agg_.probe_hits();
  if (auto it = hits.find(uint32_t(pid)); it != hits.end()) st.last_hits = it->second;
  state_.emplace(pid, st);
  ++changes_;
}

void BudgetController::remove_process(pid_t pid, uint64_t now_ns) {
  auto it = state_.find(pid);
  if (it == state_.end()) return;
  const ProcessState& st = it->second;
  exited_ratio_[pid] = st.cpu_ns_total > 0 ? st.added_ns_total / st.cpu_ns_total : 0;
  // Its last cycle ends at its exit (the exit record says when; by now at the latest), not
  // where the duty planned: a process that exits with its probes on was seen whole.
  if (now_ns) agg_.high_rate_let_go(uint32_t(pid), now_ns);
  state_.erase(it);
  ++changes_;
  switch_(pid, false, false);
}

void BudgetController::tick(uint64_t now_ns) {
  // Switches are timed from here: one process's switch can take the agent a while (see below).
  const auto tick_start = std::chrono::steady_clock::now();
  const auto hits = agg_.probe_hits();
  for (auto& [pid, st] : state_) {
    const uint64_t dt = now_ns - st.last_tick_ns;
    if (dt == 0) continue;
    const uint64_t cpu = cpu_ns_(pid);
    const double cpu_delta = cpu > st.last_cpu_ns ? double(cpu - st.last_cpu_ns) : 0;
    const auto h = hits.find(uint32_t(pid));
    const ProbeHits now_hits = h != hits.end() ? h->second : st.last_hits;
    const double high_added = hits_cost_ns(now_hits.high_rate_entries - st.last_hits.high_rate_entries,
                                           now_hits.high_rate_returns - st.last_hits.high_rate_returns);
    const double added = hits_cost_ns(now_hits.entries - st.last_hits.entries, now_hits.returns - st.last_hits.returns);
    st.cpu_ns_total += cpu_delta;
    st.added_ns_total += added;
    st.acc_cpu_ns += cpu_delta;
    st.acc_high_added_ns += high_added;
    st.acc_low_added_ns += std::max(0.0, added - high_added);
    // Probes switch only at ticks: the whole tick was on, or off.
    if (st.on) {
      st.on_ns += dt;
      st.acc_on_wall_ns += dt;
      st.acc_on_cpu_ns += cpu_delta;
    }
    st.last_cpu_ns = cpu;
    st.last_hits = now_hits;
    st.last_tick_ns = now_ns;

    // Re-estimated from at least a second of on-time (hit records arrive a poll or two late); the
    // first time from half a second: a process is found with its probes on, and a launch-bound
    // one pays their full cost until then (and is off for 99 times as long after, at 1%).
    // A process spending more than twice its budget is cut back after a fifth of a second: a job
    // that starts launching after a quiet spell (duty 1) would otherwise pay the full cost for up
    // to a second, several times its budget for a job of a few tens of seconds.
    const uint64_t estimate_after_ns = st.estimated ? 1'000'000'000 : 500'000'000;
    if (cfg_.budget >= 1) {
      st.duty = 1;  // no limit
    } else if (st.acc_on_wall_ns >= kEarlyEstimateNs) {
      // The always-on probes take their share of the budget first; the high-rate ones cost
      // `per_on` of the CPU time while on, so on for (budget - that share) / per_on of the time.
      // High-rate records reach the agent a poll or two late: those that arrive in an off
      // period belong to the on-time before it, and are counted there, not lost.
      const double low_share = st.acc_cpu_ns > 0 ? st.acc_low_added_ns / st.acc_cpu_ns : 0;
      const double per_on = st.acc_on_cpu_ns > 0 ? st.acc_high_added_ns / st.acc_on_cpu_ns
                                                 : (st.acc_high_added_ns > 0 ? 1.0 : 0.0);
      st.probe_share = std::min(1.0, per_on);
      const double wanted = per_on > 0 ? std::max(0.0, cfg_.budget - low_share) / per_on : 1.0;
      const bool full_window = st.acc_on_wall_ns >= estimate_after_ns;
      if (full_window || wanted < st.duty / 2) {
        st.estimated = true;
        // Lower at once; raise at most twofold per estimate (a burst may follow a quiet spell).
        const double before = st.duty;
        st.duty = std::clamp(wanted < st.duty ? wanted : std::min(wanted, st.duty * 2), kMinDuty, 1.0);
        changes_ += st.duty != before;
        // Lowered while on: what ran at the higher duty was within the budget then, and the on-period
        // counts as one of the new duty's at most (it ends now if it has lasted that long). A
        // process's start-up (imports, model building: few calls) runs at full duty until its loop
        // begins; the off-period sized from all of it hid the loop for 10-50 s on the H100, and
        // the live diagnosis with it.
        if (st.on && st.duty < before) {
          const auto planned_ns = uint64_t(std::ceil(std::max(cfg_.min_on_s, duty_now(st) * cfg_.cycle_s) * 1e9));
          st.phase_start_ns = std::max(st.phase_start_ns, now_ns - std::min(now_ns, planned_ns));
        }
        st.acc_on_wall_ns = 0;
        st.acc_on_cpu_ns = st.acc_cpu_ns = st.acc_high_added_ns = st.acc_low_added_ns = 0;
      }
    }

    // Where in the cycle: on for duty * cycle, off for the rest.
    const double duty = duty_now(st);
    const double on_len_s = std::max(cfg_.min_on_s, duty * cfg_.cycle_s);
    const double phase_s = double(now_ns - st.phase_start_ns) / 1e9;
    if (st.on && duty < 1 && phase_s >= on_len_s) {
      // The probes stop firing as detaching begins: the kernel removes their breakpoints first,
      // then waits for every hit in flight (synchronize_srcu). That wait took 50-290 ms on the
      // dev VM, during which no call was seen; ending the on-period where detaching returned
      // credited it with calls it never saw, and estimates came out 7-20% low.
      const uint64_t off_at = now_ns + elapsed_ns(tick_start);
      const auto detach_start = std::chrono::steady_clock::now();
      switch_(pid, false, false);
      // The probes were live from the tick that switched them on until the switch-off returned:
      // longer than planned, as ticks come late and attaching and detaching take the agent time
      // (on the H100 VM the planned duty was overrun severalfold). So the off-period is sized
      // from the on-period as it was, and the share observed stays the duty.
      const double live_s = phase_s + double(elapsed_ns(detach_start)) / 1e9;
      st.off_len_s = live_s * (1 - duty) / duty;
      st.on = false;
      st.phase_start_ns = now_ns;
      // The calls of the period just ended count for it and for the off-period as it goes
      // (Aggregator, observed_cycles.h): whatever the duty, the cycle weighs what it lasted.
      agg_.high_rate_switched_off(uint32_t(pid), off_at, st.probe_share);
      log_debug("PID {}: launch and copy probes off for {:.2f} s (on {:.2f} s; duty {:.3f}, their cost {:.2f}% of its CPU "
                "time while on)",
                pid, st.off_len_s, live_s, duty, st.probe_share * 100);
    } else if (!st.on && (duty >= 1 || phase_s >= st.off_len_s)) {
      st.on = switch_(pid, true, st.on_periods++ % kAllFunctionsEvery == 0);
      st.phase_start_ns = now_ns;
      // Live once attaching returned: until then the off-period goes on.
      if (st.on) agg_.high_rate_switched_on(uint32_t(pid), now_ns + elapsed_ns(tick_start));
    }
  }
}

uint64_t BudgetController::next_switch_ns() const {
  uint64_t next = UINT64_MAX;
  for (const auto& [pid, st] : state_) {
    const double duty = duty_now(st);
    if (duty >= 1 && st.on) continue;
    const double len_s = st.on ? std::max(cfg_.min_on_s, duty * cfg_.cycle_s) : st.off_len_s;
    next = std::min(next, st.phase_start_ns + uint64_t(len_s * 1e9));
  }
  return next;
}

void BudgetController::note_agent_cpu(double share, double budget) {
  if (budget <= 0 || budget >= 1) {
    agent_factor_ = 1;
  } else if (share > budget) {
    // Not below 5%: the agent's CPU is put down to observed calls by their share of the records
    // read (agent.cpp), an approximation, and a process observed for nothing would have counts
    // that are nothing but extrapolation.
    agent_factor_ = std::max(kMinAgentFactor, agent_factor_ * budget / share);
  } else if (share < 0.7 * budget) {
    agent_factor_ = std::min(1.0, agent_factor_ * 1.25);
  }
}

MetricFamily BudgetController::overhead_family(Aggregator& agg) const {
  MetricFamily f{"gpuscope_probe_overhead_ratio",
                 "Estimated CPU time the probes added to the process since it was found, as a share of its CPU time",
                 "ratio", MetricType::Gauge, {}};
  for (const auto& [pid, st] : state_) {
    Labels l = agg.labels_of(uint32_t(pid));
    if (!l.empty()) f.samples.push_back({std::move(l), st.cpu_ns_total > 0 ? st.added_ns_total / st.cpu_ns_total : 0});
  }
  for (auto it = exited_ratio_.begin(); it != exited_ratio_.end();) {
    Labels l = state_.contains(it->first) ? Labels{} : agg.labels_of(uint32_t(it->first));
    if (l.empty()) {
      it = exited_ratio_.erase(it);  // its series are gone (or the pid was reused)
      continue;
    }
    f.samples.push_back({std::move(l), it->second});
    ++it;
  }
  return f;
}

}  // namespace gpuscope::agent
