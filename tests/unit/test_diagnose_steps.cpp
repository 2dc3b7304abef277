// Steps found from the pattern of a loop's CUDA calls (diagnose/steps.h), on synthetic sequences.
#include <gtest/gtest.h>

#include <random>

#include "diagnose/steps.h"

using namespace gpuscope::diagnose;

namespace {

// Each step's calls, by key, 1 ms apart; `steps` steps of `pattern`.
std::vector<Token> loop(const std::vector<uint64_t>& pattern, int steps, uint64_t t0 = 1000) {
  std::vector<Token> out;
  uint64_t t = t0;
  for (int s = 0; s < steps; ++s)
    for (uint64_t k : pattern) out.push_back({t += 1'000'000, k});
  return out;
}

}  // namespace

TEST(DiagnoseSteps, ALoopIsCutAtACallMadeOnceAStep) {
  // A copy in, a kernel launched 8 times, another kernel, a sync.
  std::vector<uint64_t> pattern{1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 4};
  const auto tokens = loop(pattern, 20);
  const Steps s = find_steps(tokens);
  ASSERT_EQ(s.count(), 19u);  // the last start ends the last whole step
  EXPECT_EQ(s.period, 4u);    // the 8 launches are one element of the pattern
  EXPECT_GT(s.similarity, 0.99);
  for (size_t i = 1; i < s.starts.size(); ++i) EXPECT_EQ(s.starts[i] - s.starts[i - 1], 11'000'000u);
}

TEST(DiagnoseSteps, ACallMadeTwiceAStepDoesNotHalveIt) {
  // Kernel 7 runs twice a step, evenly spaced: its own gaps look like a period of 3, which the
  // sequence does not follow.
  const auto tokens = loop({1, 7, 2, 3, 7, 4}, 15);
  const Steps s = find_steps(tokens);
  ASSERT_GT(s.count(), 0u);
  EXPECT_EQ(s.period, 6u);
  EXPECT_EQ(s.count(), 14u);
}

TEST(DiagnoseSteps, OddStepsAndAnEvery5StepsCallStillGiveEveryStep) {
  std::vector<Token> tokens;
  uint64_t t = 0;
  std::mt19937 rng(7);
  for (int s = 0; s < 40; ++s) {
    for (uint64_t k : {10, 11, 12, 13}) tokens.push_back({t += 1'000'000 + rng() % 500'000, k});
    if (s % 5 == 0) tokens.push_back({t += 1'000'000, 99});  // logging every 5 steps
    if (s == 17) tokens.push_back({t += 1'000'000, 55});     // a one-off call
  }
  const Steps s = find_steps(tokens);
  EXPECT_GE(s.count(), 35u);
  EXPECT_LE(s.count(), 39u);
}

TEST(DiagnoseSteps, NoRepeatingPatternGivesNoSteps) {
  std::vector<Token> tokens;
  std::mt19937 rng(3);
  for (uint64_t i = 0; i < 300; ++i) tokens.push_back({i * 1000, rng() % 50});
  EXPECT_EQ(find_steps(tokens).count(), 0u);
  EXPECT_EQ(find_steps({}).count(), 0u);
  EXPECT_EQ(find_steps(loop({1, 2, 3}, 2)).count(), 0u);  // too few to call it a loop
}

TEST(DiagnoseSteps, IdenticalLayersRepeatWithinTheStepThatCopiesTheirInput) {
  // An inference loop: the input copied in (key 1, to the GPU), six identical layers (kernels 20,
  // 21, 22), the output copied back and an event waited for. The layers alone look like a period
  // of 3 that most of the sequence follows.
  std::vector<Token> tokens;
  uint64_t t = 0;
  for (int s = 0; s < 30; ++s) {
    tokens.push_back({t += 1'000'000, 1, true});
    for (int layer = 0; layer < 6; ++layer)
      for (uint64_t k : {20, 21, 22}) tokens.push_back({t += 1'000'000, k});
    for (uint64_t k : {30, 31}) tokens.push_back({t += 1'000'000, k});
  }
  const Steps s = find_steps(tokens);
  EXPECT_EQ(s.period, 21u);
  EXPECT_EQ(s.count(), 29u);
  // Without knowing which copy brings the input, the layers would be taken for steps.
  for (auto& tok : tokens) tok.input = false;
  EXPECT_EQ(find_steps(tokens).period, 3u);
}

TEST(DiagnoseSteps, ALoopOfOneKindOfCallIsCutAtTheHostsGaps) {
  // 30 launches of one kernel 5 us apart, then 4 ms of host work: no pattern once the repeats
  // are collapsed, but bursts.
  std::vector<Token> tokens;
  uint64_t t = 1'000'000;
  for (int s = 0; s < 40; ++s) {
    for (int i = 0; i < 30; ++i) tokens.push_back({t += 5'000, 9});
    t += 4'000'000;
  }
  const Steps s = find_steps(tokens);
  ASSERT_EQ(s.count(), 38u);  // the first burst counts from the first gap
  EXPECT_EQ(s.period, 30u);
  for (size_t i = 1; i < s.starts.size(); ++i) EXPECT_EQ(s.starts[i] - s.starts[i - 1], 4'150'000u);

  // Calls one kind at even spacing (no host gap), or bursts that are not alike: no steps.
  std::vector<Token> even;
  for (int i = 0; i < 500; ++i) even.push_back({1'000'000 + uint64_t(i) * 100'000, 9});
  EXPECT_EQ(find_steps(even).count(), 0u);
  std::mt19937 rng(3);
  std::vector<Token> ragged;
  t = 1'000'000;
  for (int s = 0; s < 40; ++s) {
    for (int i = 0, n = 1 + int(rng() % 40); i < n; ++i) ragged.push_back({t += 5'000, 9});
    t += 1'000'000 + rng() % 8'000'000;
  }
  EXPECT_EQ(find_steps(ragged).count(), 0u);
}
