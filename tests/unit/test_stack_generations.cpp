// The rules of stack map recycling (record::StackGenerations): when to switch maps, when the
// old one may be emptied, and which ids may no longer be read.
#include <gtest/gtest.h>

#include "record/stack_generations.h"

using namespace gpuscope::record;
using Step = StackGenerations::Step;

namespace {

constexpr uint64_t kMs = 1'000'000;

int32_t id_in(int generation, int32_t bucket) { return generation ? bucket | GS_STACK_GEN_BIT : bucket; }

}  // namespace

TEST(StackGenerations, TheGenerationIsBit30AndErrnosStayNegative) {
  EXPECT_EQ(StackGenerations::generation_of(17), 0);
  EXPECT_EQ(StackGenerations::generation_of(17 | GS_STACK_GEN_BIT), 1);
  EXPECT_EQ((17 | GS_STACK_GEN_BIT) & GS_STACK_ID_MASK, 17);
  EXPECT_GT(GS_STACK_GEN_BIT | GS_STACK_ID_MASK, 0);  // a tagged id is never taken for an errno
}

TEST(StackGenerations, FlipsAtTheThresholdAndEmptiesOnlyAfterTheGrace) {
  StackGenerations g(0.25, 16);  // recycle at 4 distinct ids
  for (int32_t b : {1, 2, 3, 3, 2}) g.seen(id_in(0, b));
  EXPECT_EQ(g.next(1000 * kMs), Step::None);  // 3 distinct
  g.seen(id_in(1, 4));                         // an id of the other map counts there
  EXPECT_EQ(g.next(1000 * kMs), Step::None);
  g.seen(id_in(0, 9));
  ASSERT_EQ(g.next(1000 * kMs), Step::Flip);
  g.flipped(1, 1000 * kMs);
  EXPECT_EQ(g.current(), 1);
  // Work taken before the grace ran out may miss records sent before the flip.
  EXPECT_EQ(g.next(1000 * kMs + StackGenerations::kGraceNs - 1), Step::None);
  ASSERT_EQ(g.next(1000 * kMs + StackGenerations::kGraceNs), Step::Empty);
  g.emptied(1400 * kMs);
  EXPECT_EQ(g.next(1400 * kMs), Step::None);
  // Generation 1 had one id before the flip: it needs three more to be recycled in turn.
  for (int32_t b : {5, 6}) g.seen(id_in(1, b));
  EXPECT_EQ(g.next(1500 * kMs), Step::None);
  g.seen(id_in(1, 7));
  EXPECT_EQ(g.next(1500 * kMs), Step::Flip);
}

TEST(StackGenerations, IdsCapturedBeforeTheirMapWasEmptiedAreNeverRead) {
  StackGenerations g(0.5, 4);
  const int32_t before = id_in(0, 1);
  EXPECT_FALSE(g.expired(before, 10 * kMs));
  g.seen(id_in(0, 1));
  g.seen(id_in(0, 2));
  ASSERT_EQ(g.next(20 * kMs), Step::Flip);
  g.flipped(1, 20 * kMs);
  // Before the emptying, the old map still holds its stacks.
  EXPECT_FALSE(g.expired(before, 10 * kMs));
  ASSERT_EQ(g.next(20 * kMs + StackGenerations::kGraceNs), Step::Empty);
  g.emptied(400 * kMs);
  // A call that entered at 10 ms and returns now: its id may name another stack.
  EXPECT_TRUE(g.expired(before, 10 * kMs));
  EXPECT_TRUE(g.expired(before, 399 * kMs));
  // Generation 1's ids, and generation 0's once it is current again, are read.
  EXPECT_FALSE(g.expired(id_in(1, 1), 30 * kMs));
  g.seen(id_in(1, 1));
  g.seen(id_in(1, 2));
  ASSERT_EQ(g.next(500 * kMs), Step::Flip);
  g.flipped(0, 500 * kMs);
  EXPECT_FALSE(g.expired(id_in(0, 1), 600 * kMs));
  ASSERT_EQ(g.next(500 * kMs + StackGenerations::kGraceNs), Step::Empty);
  g.emptied(900 * kMs);
  EXPECT_TRUE(g.expired(id_in(1, 1), 30 * kMs));
  EXPECT_FALSE(g.expired(id_in(0, 1), 600 * kMs));
}

TEST(StackGenerations, NeverRecyclesWhenOff) {
  StackGenerations g(0, 4);
  for (int32_t b = 0; b < 100; ++b) g.seen(id_in(0, b));
  EXPECT_EQ(g.next(uint64_t(1) << 62), Step::None);
  EXPECT_FALSE(g.expired(id_in(0, 1), 0));
}
