#include "record/stack_budget.h"

#include <gtest/gtest.h>

using gpuscope::record::StackBudget;

namespace {

constexpr uint64_t kMs = 1'000'000;

// A process whose every stack would cost `full_share` of its time, observed every `step_ms`
// for `steps` intervals while the budget picks N: each interval's walks cost full_share / N.
struct Simulated {
  StackBudget budget;
  uint64_t now = 0, walk_ns = 0;
  uint32_t every = 1;

  explicit Simulated(double b) : budget(b) { budget.observe(1, now, walk_ns, 0, 0); }
  void run(double full_share, int steps, uint64_t step_ms = 250) {
    for (int i = 0; i < steps; ++i) {
      now += step_ms * kMs;
      walk_ns += uint64_t(full_share / every * double(step_ms * kMs));
      if (auto n = budget.observe(1, now, walk_ns, 0, 0)) every = *n;
    }
  }
  double share() const { return 1.0 / every; }
};

}  // namespace

TEST(StackBudget, EveryStackWhileTheWalksCostLessThanTheBudget) {
  Simulated p(0.01);
  p.run(0.005, 20);
  EXPECT_EQ(p.every, 1u);
  EXPECT_EQ(p.budget.processes().at(1).changes, 0u);
}

TEST(StackBudget, OneInNOnceEveryStackWouldCostMore) {
  Simulated p(0.01);
  p.run(0.05, 1);
  // 5% at every stack against 1%: one in 5 meets it; the headroom takes it to 7.
  EXPECT_EQ(p.every, 7u);
  p.run(0.05, 20);
  EXPECT_EQ(p.every, 7u) << "a steady cost keeps its N";
  EXPECT_LE(0.05 / p.every, 0.01);
  EXPECT_EQ(p.budget.processes().at(1).max_every, 7u);
}

TEST(StackBudget, LowersNByQuartersOnceTheWalksGetCheap) {
  Simulated p(0.01);
  p.run(0.40, 1);
  EXPECT_EQ(p.every, 50u);
  p.run(0.0, 1);
  EXPECT_EQ(p.every, 38u) << "at most by a quarter an interval";
  p.run(0.0, 20);
  EXPECT_EQ(p.every, 1u);
}

TEST(StackBudget, KeepsNBetweenTheBounds) {
  Simulated p(0.01);
  p.run(0.05, 1);
  ASSERT_EQ(p.every, 7u);
  // The walks now cost 0.8% at N = 7 (a walk costs more when walks are further apart): under
  // the budget and above budget / 1.5, so N stays.
  p.run(0.056, 10);
  EXPECT_EQ(p.every, 7u);
}

TEST(StackBudget, DecidesAtMostOnceAnInterval) {
  StackBudget b(0.01);
  constexpr uint64_t first = StackBudget::kFirstIntervalNs, next = StackBudget::kIntervalNs;
  b.observe(7, 0, 0, 0, 0);
  EXPECT_FALSE(b.observe(7, first - 1, first / 10, 10, 0)) << "too soon";
  // The first decision comes sooner than the next ones: a process starting a launch loop pays
  // for every stack for a short time only.
  auto n = b.observe(7, first, first / 5, 10, 0);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 25u);  // 20%
  EXPECT_FALSE(b.observe(7, first + next - 1, first, 20, 0));
  n = b.observe(7, first + next, first / 5 + next * 8 / 10, 20, 0);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 25u * 100);  // 80% at 1 in 25
}

TEST(StackBudget, TheFirstDecisionCountsFromTheFirstWalk) {
  // First seen 300 ms after its first walk, its walks having taken 60 ms: decided at once.
  StackBudget b(0.01);
  const auto n = b.observe(3, 1000 * kMs, 60 * kMs, 100, 700 * kMs);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 25u);  // 20%
  EXPECT_NEAR(b.processes().at(3).share(), 0.2, 1e-9);
  // Without the first walk's time it waits an interval from first sight.
  EXPECT_FALSE(b.observe(4, 1000 * kMs, 60 * kMs, 100, 0));
}

TEST(StackBudget, ProcessesAreApartAndForgotten) {
  StackBudget b(0.01);
  b.observe(1, 0, 0, 0, 0);
  b.observe(2, 0, 0, 0, 0);
  EXPECT_TRUE(b.observe(1, 250 * kMs, 25 * kMs, 100, 0));
  EXPECT_FALSE(b.observe(2, 250 * kMs, 0, 0, 0));
  EXPECT_EQ(b.processes().at(2).every, 1u);
  EXPECT_NEAR(b.processes().at(1).share(), 0.1, 1e-9);
  b.forget(1);
  EXPECT_FALSE(b.processes().contains(1));
}

TEST(StackBudget, NeverAboveItsCap) {
  Simulated p(0.000001);
  p.run(1.0, 1);
  EXPECT_EQ(p.every, StackBudget::kMaxEvery);
}
