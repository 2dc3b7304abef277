// record::Stitcher: stacks of work handed to another thread, stored below the caller's.
#include <gtest/gtest.h>

#include <map>

#include "record/stitcher.h"

using gpuscope::record::Stitcher;
using gpuscope::store::StoredFrame;
using Frames = Stitcher::Frames;

namespace {

constexpr uint16_t kAutograd = 1000;
constexpr int64_t kModule = 7, kSeparatorModule = 9, kCutModule = 11;

Frames frames(std::initializer_list<uint64_t> offsets) {
  Frames f;
  for (uint64_t o : offsets) f.push_back({kModule, o, o});
  return f;
}

// A sink's interning: the same frames, the same id.
struct Interner {
  static std::vector<uint64_t> key(const Frames& f) {
    std::vector<uint64_t> k;
    for (const auto& x : f) k.insert(k.end(), {uint64_t(x.module_id), x.offset, x.ip});
    return k;
  }
  std::map<std::vector<uint64_t>, int64_t> ids;
  std::map<int64_t, Frames> by_id;
  int calls = 0;
  int64_t operator()(const Frames& f) {
    ++calls;
    auto [it, added] = ids.try_emplace(key(f), int64_t(ids.size()) + 1);
    by_id[it->second] = f;
    return it->second;
  }
};

struct StitcherTest : testing::Test {
  Interner sink;
  Stitcher stitcher{[this](const Frames& f) { return sink(f); },
                    [](uint16_t h) { return StoredFrame{kSeparatorModule, h, 0}; },
                    [] { return StoredFrame{kCutModule, 0, 0}; }};
  int64_t worker_stack(std::initializer_list<uint64_t> offsets) {
    const Frames f = frames(offsets);
    const int64_t id = sink(f);
    stitcher.note_worker_stack(id, f, kAutograd);
    return id;
  }
};

}  // namespace

TEST_F(StitcherTest, AWorkersStackGoesBelowTheLatestCallersStack) {
  const int64_t worker = worker_stack({1, 2, 3});
  stitcher.on_handoff(100, 100, kAutograd, frames({50, 51}), false);
  const int64_t stitched = stitcher.stitch(100, 101, worker);
  ASSERT_NE(stitched, worker);
  Frames expected = frames({1, 2, 3});
  expected.push_back({kSeparatorModule, kAutograd, 0});
  for (const auto& f : frames({50, 51})) expected.push_back(f);
  EXPECT_EQ(sink.by_id[stitched], expected);
  // Found again without interning anew; a later pass from another line gets its stack.
  const int calls = sink.calls;
  EXPECT_EQ(stitcher.stitch(100, 101, worker), stitched);
  EXPECT_EQ(sink.calls, calls);
  stitcher.on_handoff(100, 100, kAutograd, frames({60, 51}), false);
  const int64_t later = stitcher.stitch(100, 101, worker);
  EXPECT_NE(later, stitched);
  EXPECT_EQ(sink.by_id[later].back(), (StoredFrame{kModule, 51, 51}));
  EXPECT_EQ(stitcher.stitched(), 3u);
}

TEST_F(StitcherTest, AWorkerKnownByItsThreadsNameAloneIsMarkedCut) {
  const Frames own = frames({1, 2});
  const int64_t worker = sink(own);
  stitcher.note_worker_stack(worker, own, kAutograd, true);
  stitcher.on_handoff(100, 100, kAutograd, frames({50}), false);
  const Frames& stitched = sink.by_id[stitcher.stitch(100, 101, worker)];
  ASSERT_EQ(stitched.size(), 5u);
  EXPECT_EQ(stitched[2], (StoredFrame{kCutModule, 0, 0}));
  EXPECT_EQ(stitched[3], (StoredFrame{kSeparatorModule, kAutograd, 0}));
}

TEST_F(StitcherTest, OtherStacksAndOtherProcessesAreLeftAlone) {
  const int64_t worker = worker_stack({1, 2});
  const int64_t plain = sink(frames({4, 5}));
  stitcher.on_handoff(100, 100, kAutograd, frames({50}), false);
  EXPECT_EQ(stitcher.stitch(100, 101, plain), plain);
  EXPECT_EQ(stitcher.stitch(100, 101, 0), 0);
  // The caller's own thread runs work of the pass too: its stack reaches its entry already.
  EXPECT_EQ(stitcher.stitch(100, 100, worker), worker);
  // Another process has made no handoff: counted, not stitched.
  EXPECT_EQ(stitcher.stitch(200, 201, worker), worker);
  EXPECT_EQ(stitcher.orphans(), 1u);
  stitcher.forget_process(100);
  EXPECT_EQ(stitcher.stitch(100, 101, worker), worker);
  EXPECT_EQ(stitcher.orphans(), 2u);
}

TEST_F(StitcherTest, AHandoffMadeOnAWorkerThreadKeepsTheRoot) {
  const int64_t worker = worker_stack({1});
  stitcher.on_handoff(100, 100, kAutograd, frames({50}), false);
  const int64_t stitched = stitcher.stitch(100, 101, worker);
  // A backward pass inside the backward pass, from the worker thread.
  stitcher.on_handoff(100, 101, kAutograd, frames({1, 70}), true);
  EXPECT_EQ(stitcher.stitch(100, 102, worker), stitched);
}

TEST_F(StitcherTest, StacksForgottenBySinkAreStoredAgain) {
  const int64_t worker = worker_stack({1});
  stitcher.on_handoff(100, 100, kAutograd, frames({50}), false);
  const int64_t stitched = stitcher.stitch(100, 101, worker);
  stitcher.forget_stacks();
  // Ids are void: the worker's stack must be noted again before it is stitched.
  EXPECT_EQ(stitcher.stitch(100, 101, worker), worker);
  stitcher.note_worker_stack(worker, frames({1}), kAutograd);
  const int calls = sink.calls;
  EXPECT_EQ(stitcher.stitch(100, 101, worker), stitched);
  EXPECT_GT(sink.calls, calls);  // the caller's stack and the stitched one, interned again
}

TEST_F(StitcherTest, TooManyWorkerStacksAreAllForgotten) {
  for (size_t i = 0; i < Stitcher::kMaxWorkerStacks; ++i)
    ASSERT_TRUE(stitcher.note_worker_stack(int64_t(i) + 1, frames({i}), kAutograd));
  EXPECT_FALSE(stitcher.note_worker_stack(int64_t(Stitcher::kMaxWorkerStacks) + 1, frames({0}), kAutograd));
  stitcher.on_handoff(100, 100, kAutograd, frames({50}), false);
  EXPECT_EQ(stitcher.stitch(100, 101, 1), 1);  // forgotten
  EXPECT_NE(stitcher.stitch(100, 101, int64_t(Stitcher::kMaxWorkerStacks) + 1),
            int64_t(Stitcher::kMaxWorkerStacks) + 1);  // the one noted after
}
