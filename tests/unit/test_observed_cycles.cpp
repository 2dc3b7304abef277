// What a duty-cycled process's launch and copy counters say (agent/observed_cycles.h): the calls
// of each on-period stand for the cycle as it was lived, exact counts say so, and estimates carry
// a bound. Driven through the Aggregator (and the budget) with a clock of the test's own.
#include <gtest/gtest.h>
#include <unistd.h>

#include "agent/aggregator.h"
#include "agent/budget.h"
#include "cuda/functions.h"
#include "snapshot_value.h"

using namespace gpuscope;

namespace {

constexpr uint64_t kMs = 1'000'000, kS = 1'000'000'000;
constexpr uint64_t kLag = agent::ObservedCycles::kRecordLagNs;

CallEvent call_at(uint32_t pid, const char* symbol, uint64_t ts) {
  const auto* f = cuda::function_by_symbol(symbol);
  CallEvent e;
  e.pid = e.tid = pid;
  e.func = f->id;
  e.has_return = f->has_return;
  e.ts_ns = ts;
  return e;
}

using test::value;

// A process known to an aggregator whose clock the test moves.
struct Traced {
  uint64_t now = 10 * kS;
  agent::Aggregator agg{{}, 0, "/", [this] { return now; }};
  const uint32_t pid = uint32_t(getpid());
  Traced() { agg.add_call(call_at(pid, "cudaDeviceSynchronize", now)); }
  // n launches evenly over [from, to)
  void launches(uint64_t n, uint64_t from, uint64_t to) {
    for (uint64_t i = 0; i < n; ++i) agg.add_call(call_at(pid, "cudaLaunchKernel", from + (to - from) * i / n));
  }
  agent::MetricSnapshot at(uint64_t t) {
    now = t;
    return agg.snapshot({}, 1);
  }
};

}  // namespace

TEST(ObservedCycles, AProcessThatLivesInsideOneOnPeriodIsCountedExactlyWhateverTheDuty) {
  // The issue: with the agent's own CPU over its budget (process churn), every duty is cut to
  // 0.385; a process making 1,007 launches in 50 ms lived its whole life with its probes on,
  // yet was counted 1 / 0.385 times (2,615) and said observed_ratio 1.
  Traced t;
  agent::BudgetConfig cfg;
  cfg.budget = 0.01;
  cfg.entry_hit_ns = cfg.return_hit_ns = 1000;
  agent::BudgetController budget(cfg, t.agg, [](pid_t, bool on, bool) { return on; });
  budget.note_agent_cpu(0.13, 0.05);
  ASSERT_NEAR(budget.agent_factor(), 0.385, 0.001);
  const uint64_t found = t.now;
  budget.add_process(pid_t(t.pid), found);
  t.launches(1007, found + 1 * kMs, found + 50 * kMs);
  t.agg.set_process_exit(t.pid, found + 51 * kMs, 0);
  budget.tick(found + 100 * kMs);
  budget.remove_process(pid_t(t.pid), found + 100 * kMs);
  const auto s = t.at(found + 150 * kMs);  // the exit is known: no lag needed
  EXPECT_EQ(value(s, "gpuscope_kernel_launches_total"), 1007);
  EXPECT_EQ(value(s, "gpuscope_counts_exact"), 1);
  EXPECT_EQ(value(s, "gpuscope_observed_ratio"), 1);
  EXPECT_EQ(value(s, "gpuscope_estimate_error_ratio"), 0);
}

TEST(ObservedCycles, OnPeriodCallsStandForTheCycleAsItIsLived) {
  Traced t;
  const uint64_t t0 = t.now;
  t.agg.high_rate_found(t.pid, t0);
  t.agg.high_rate_switched_on(t.pid, t0);
  t.launches(100, t0, t0 + 200 * kMs);
  // Seen at once, each once: the off-period has not begun.
  EXPECT_EQ(value(t.at(t0 + 100 * kMs), "gpuscope_kernel_launches_total"), 100);
  t.agg.high_rate_switched_off(t.pid, t0 + 200 * kMs, 0);
  EXPECT_EQ(value(t.at(t0 + 200 * kMs + kLag), "gpuscope_kernel_launches_total"), 100);
  // 0.8 s into the off-period (as of the records' lag): each stands for (0.2 + 0.8) / 0.2.
  auto s = t.at(t0 + 1000 * kMs + kLag);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_kernel_launches_total"), 500);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_observed_ratio"), 0.2);
  EXPECT_EQ(value(s, "gpuscope_counts_exact"), 0);
  // On again after 1.8 s off: the cycle ends, 10 each, however late the snapshot.
  t.agg.high_rate_switched_on(t.pid, t0 + 2000 * kMs);
  EXPECT_DOUBLE_EQ(value(t.at(t0 + 2001 * kMs), "gpuscope_kernel_launches_total"), 1000);
  // A record of the first on-period arriving now counts as its cycle's calls do.
  t.agg.add_call(call_at(t.pid, "cudaLaunchKernel", t0 + 150 * kMs));
  // And one of the new cycle, once.
  t.agg.add_call(call_at(t.pid, "cudaLaunchKernel", t0 + 2100 * kMs));
  EXPECT_DOUBLE_EQ(value(t.at(t0 + 2200 * kMs), "gpuscope_kernel_launches_total"), 1011);
}

TEST(ObservedCycles, AStartUpWithoutCallsStandsForNoneOfThem) {
  // Found at its first CUDA library's load, a process starts up for 250 ms (CUDA's context,
  // Python's imports) before its first launch, then launches 1,000 a second: 250 seen in its
  // first on-period, 500 made in the off-period after it. Its first launches stand for the time
  // from the first of them. (Taken over the whole on-period, a start-up of ~0.25 s cut an H100
  // program's 4,000 launches over 4 s to 3,223-3,476 estimated.) Found running instead, its
  // quiet time is a sample of its ways, and counts.
  for (const bool at_start : {true, false}) {
    Traced t;
    const uint64_t t0 = t.now;
    t.agg.high_rate_found(t.pid, t0, at_start);
    t.agg.high_rate_switched_on(t.pid, t0);
    t.launches(250, t0 + 250 * kMs, t0 + 500 * kMs);
    t.agg.high_rate_switched_off(t.pid, t0 + 500 * kMs, 0);
    t.agg.high_rate_switched_on(t.pid, t0 + 1000 * kMs);
    t.launches(500, t0 + 1000 * kMs, t0 + 1500 * kMs);
    EXPECT_DOUBLE_EQ(value(t.at(t0 + 1500 * kMs), "gpuscope_kernel_launches_total"), at_start ? 1250 : 1000)
        << at_start;
  }
  // Switched off before its first launch: that on-period stands for nothing, and the next one,
  // where the launches begin, for its cycle from then on.
  Traced t;
  const uint64_t t0 = t.now;
  t.agg.high_rate_found(t.pid, t0, true);
  t.agg.high_rate_switched_on(t.pid, t0);
  t.agg.high_rate_switched_off(t.pid, t0 + 100 * kMs, 0);
  t.agg.high_rate_switched_on(t.pid, t0 + 200 * kMs);
  t.launches(100, t0 + 300 * kMs, t0 + 400 * kMs);
  t.agg.high_rate_switched_off(t.pid, t0 + 400 * kMs, 0);
  t.agg.high_rate_switched_on(t.pid, t0 + 600 * kMs);
  EXPECT_DOUBLE_EQ(value(t.at(t0 + 600 * kMs), "gpuscope_kernel_launches_total"), 300);
}

TEST(ObservedCycles, AProcessThatExitsDuringAnOffPeriodIsCountedForTheTimeItLived) {
  Traced t;
  const uint64_t t0 = t.now;
  t.agg.high_rate_found(t.pid, t0);
  t.agg.high_rate_switched_on(t.pid, t0);
  t.launches(100, t0, t0 + 200 * kMs);
  t.agg.high_rate_switched_off(t.pid, t0 + 200 * kMs, 0);  // planned: off for 19.8 s (1%)
  // It exits 0.3 s later. Before its exit record comes, the off-period is credited only up to
  // the records' lag (here 0.1 s of it), lest it run past an exit on its way.
  static_assert(kLag == 500 * kMs);
  auto s = t.at(t0 + 800 * kMs);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_kernel_launches_total"), 150);
  // The budget lets go of it (found gone at 0.9 s), then its exit record says 0.5 s.
  t.agg.high_rate_let_go(t.pid, t0 + 900 * kMs);
  t.agg.set_process_exit(t.pid, t0 + 500 * kMs, 0);
  s = t.at(t0 + 1000 * kMs);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_kernel_launches_total"), 250);  // (0.2 + 0.3) / 0.2 each
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_observed_ratio"), 0.4);
  EXPECT_EQ(value(s, "gpuscope_counts_exact"), 0);
  // No on-period after the off-period: the 150 calls credited to it are all in doubt.
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_estimate_error_ratio"), 150.0 / 250);
  EXPECT_EQ(value(t.at(t0 + 5 * kS), "gpuscope_kernel_launches_total"), -1);  // dropped after its last export
}

TEST(ObservedCycles, CallsSeenPastASwitchMoveItThere) {
  // The agent times a switch-off where it begins detaching and a switch-on where attaching has
  // returned; the kernel removes breakpoints a little after the one (and then waits, up to
  // 290 ms on the dev VM) and inserts them a little before the other. The calls seen say where
  // the probes really were live, so that an on-period's rate is not taken over a time it was
  // not seen, nor an off-period credited with calls that were.
  Traced t;
  const uint64_t t0 = t.now;
  t.agg.high_rate_found(t.pid, t0);
  t.agg.high_rate_switched_on(t.pid, t0);
  t.launches(50, t0, t0 + 100 * kMs);                     // the last at 98 ms
  t.agg.high_rate_switched_off(t.pid, t0 + 80 * kMs, 0);  // detaching began at 80 ms
  t.agg.add_call(call_at(t.pid, "cudaLaunchKernel", t0 + 99 * kMs));  // a record arriving late
  t.agg.high_rate_switched_on(t.pid, t0 + 990 * kMs);
  // On for 99 ms, the cycle 990 ms: each stands for 10.
  EXPECT_NEAR(value(t.at(t0 + 991 * kMs), "gpuscope_kernel_launches_total"), 510, 1e-9);
  // Seen at 985 ms, while the next cycle's probes were being attached: that cycle's, once.
  t.agg.add_call(call_at(t.pid, "cudaLaunchKernel", t0 + 985 * kMs));
  t.agg.set_process_exit(t.pid, t0 + 1100 * kMs, 0);
  const auto s = t.at(t0 + 2 * kS);
  EXPECT_NEAR(value(s, "gpuscope_kernel_launches_total"), 511, 1e-9);
  EXPECT_NEAR(value(s, "gpuscope_observed_ratio"), (99.0 + 115) / 1100, 1e-9);
}

TEST(ObservedCycles, TheBoundFollowsTheChangeOfRateAcrossEachOffPeriodAndTheObserverEffect) {
  Traced t;
  const uint64_t t0 = t.now;
  t.agg.high_rate_found(t.pid, t0);
  // Cycle 1: 0.2 s on at 500/s, 0.8 s off. Cycle 2: 0.2 s on at 600/s, then on until now.
  t.agg.high_rate_switched_on(t.pid, t0);
  t.launches(100, t0, t0 + 200 * kMs);
  t.agg.high_rate_switched_off(t.pid, t0 + 200 * kMs, 0);
  t.agg.high_rate_switched_on(t.pid, t0 + 1000 * kMs);
  t.launches(120, t0 + 1000 * kMs, t0 + 1200 * kMs);
  auto s = t.at(t0 + 1200 * kMs + kLag);
  const double estimate = 100 * 5 + 120;
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_kernel_launches_total"), estimate);
  // The off-period's 0.8 s at anywhere between 500/s and 600/s: 80 calls either way.
  EXPECT_NEAR(value(s, "gpuscope_estimate_error_ratio"), 80 / estimate, 1e-9);
  // A caller whose probes took half its CPU time while on could have run twice as fast
  // unobserved: the 400 calls credited to the off-period may be 400 short.
  Traced u;
  u.agg.high_rate_found(u.pid, t0);
  u.agg.high_rate_switched_on(u.pid, t0);
  u.launches(100, t0, t0 + 200 * kMs);
  u.agg.high_rate_switched_off(u.pid, t0 + 200 * kMs, 0.5);
  u.agg.high_rate_switched_on(u.pid, t0 + 1000 * kMs);
  u.launches(120, t0 + 1000 * kMs, t0 + 1200 * kMs);
  EXPECT_NEAR(value(u.at(t0 + 1200 * kMs + kLag), "gpuscope_estimate_error_ratio"), (80 + 400) / estimate, 1e-9);
}

TEST(ObservedCycles, OldCyclesFoldIntoTheTotalsAndTheirBoundStays) {
  Traced t;
  uint64_t c = t.now;
  t.agg.high_rate_found(t.pid, c);
  // Ten cycles of 0.1 s on (at 1000/s), 0.9 s off: each call stands for 10.
  for (int i = 0; i < 10; ++i, c += kS) {
    t.agg.high_rate_switched_on(t.pid, c);
    t.launches(100, c, c + 100 * kMs);
    t.agg.high_rate_switched_off(t.pid, c + 100 * kMs, 0);
  }
  t.agg.high_rate_switched_on(t.pid, c);
  t.launches(100, c, c + 100 * kMs);
  t.agg.set_process_exit(t.pid, c + 100 * kMs, 0);
  const auto s = t.at(c + kS);
  EXPECT_NEAR(value(s, "gpuscope_kernel_launches_total"), 10 * 1000 + 100, 1e-6);
  EXPECT_NEAR(value(s, "gpuscope_observed_ratio"), 1.1 / 10.1, 1e-9);
  EXPECT_EQ(value(s, "gpuscope_estimate_error_ratio"), 0);  // a steady rate: no change to doubt
}

TEST(ObservedCycles, LaunchesPastTheKernelCapCountAsOtherAtTheirWeight) {
  agent::AggregatorLimits limits;
  limits.max_kernel_names = 1;
  uint64_t now = 10 * kS;
  agent::Aggregator agg(limits, 0, "/", [&] { return now; });
  const uint32_t pid = uint32_t(getpid());
  const int64_t a = agg.intern_kernel("_Z1av", "a()"), b = agg.intern_kernel("_Z1bv", "b()");
  agg.high_rate_found(pid, now);
  agg.high_rate_switched_on(pid, now);
  for (int64_t k : {a, b, b}) {
    auto e = call_at(pid, "cudaLaunchKernel", now + kMs);
    e.kernel_id = k;
    agg.add_call(e);
  }
  agg.high_rate_switched_off(pid, now + 100 * kMs, 0);
  agg.high_rate_switched_on(pid, now + 400 * kMs);
  now += kS;
  const auto s = agg.snapshot({}, 1);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_kernel_launches_total", {{"kernel", "a"}}), 4);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_kernel_launches_total", {{"kernel", "other"}}), 8);
  EXPECT_EQ(agg.shed().kernel_names, 2u);  // once per launch, not per weighing
}
