// The pinning library's decisions and bookkeeping (src/pin/pinner.h), with a driver that keeps
// what is registered as the real one does; the library's own memory (pin/arena.h) is real.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "pin/pinner.h"

namespace gpuscope::pin {
namespace {

class KeptRanges : public Driver {
 public:
  bool usable() override { return usable_now; }
  Result register_range(void* p, size_t bytes) override {
    ++calls;
    if (answer != Result::ok) return answer;
    EXPECT_FALSE(ranges.count(p)) << "registered twice";
    ranges[p] = bytes;
    return Result::ok;
  }
  void unregister_range(void* p, size_t) override {
    ++calls;
    EXPECT_TRUE(ranges.count(p)) << "unregistering what is not registered";
    ranges.erase(p);
  }
  bool covers(const void* p) const {
    for (auto& [base, bytes] : ranges)
      if (p >= base && static_cast<const char*>(p) < static_cast<const char*>(base) + bytes) return true;
    return false;
  }
  bool usable_now = true;
  Result answer = Result::ok;
  std::map<void*, size_t> ranges;
  int calls = 0;
};

constexpr size_t MiB = size_t(1) << 20;

struct PinnerTest : ::testing::Test {
  KeptRanges driver;
  Settings settings;
  std::unique_ptr<Pinner> pinner;
  void make() { pinner = std::make_unique<Pinner>(settings, advise::builtin_copy_model(), driver); }
  void SetUp() override { make(); }
  bool copy(void* p, size_t n, bool to_device = true) { return pinner->on_copy(p, n, to_device).pinned; }
};

TEST_F(PinnerTest, ABufferIsPinnedOnceItsCopiesPayForIt) {
  void* p = pinner->allocate(16 * MiB, false, 1);
  ASSERT_TRUE(p && pinner->owns(p));
  // 16 MiB host to device: pinning saves ~1 ms a copy and costs ~2 ms to register and unregister.
  EXPECT_FALSE(copy(p, 16 * MiB));
  EXPECT_TRUE(copy(p, 16 * MiB));
  EXPECT_TRUE(driver.covers(p));
  EXPECT_TRUE(copy(p, 16 * MiB));
  const auto s = pinner->stats();
  EXPECT_EQ(s.registrations, 1u);
  EXPECT_EQ(s.pageable_copies, 1u);
  EXPECT_EQ(s.pinned_copies, 2u);
}

TEST_F(PinnerTest, SmallAllocationsAreLeftToTheCLibrary) {
  EXPECT_EQ(pinner->allocate(settings.min_bytes - 1, false, 1), nullptr);
}

TEST_F(PinnerTest, BuffersCopiedOnceAreNeverPinned) {
  // A checkpoint: 16 tensors of 64 MiB, each copied to the host once and kept.
  std::vector<void*> kept;
  for (int i = 0; i < 16; ++i) {
    kept.push_back(pinner->allocate(64 * MiB, false, 7));
    EXPECT_FALSE(copy(kept.back(), 64 * MiB, false));
  }
  EXPECT_EQ(driver.calls, 0);
  for (void* p : kept) pinner->release(p);
  EXPECT_EQ(driver.calls, 0);
}

TEST_F(PinnerTest, ALinesBatchesPayForAPinnedBufferThenReuseIt) {
  // A data loader's batch: made, copied to the GPU once, freed, every step.
  const size_t batch = 12 * MiB + 600 * 1024;
  for (int step = 0; step < 60; ++step) {
    void* p = pinner->allocate(batch, false, 42);
    std::memset(p, step, batch);
    copy(p, batch);
    pinner->release(p);
  }
  const auto s = pinner->stats();
  EXPECT_EQ(s.fresh_pins, 1u);
  EXPECT_EQ(s.registrations, 1u);
  EXPECT_GE(s.pool_hits, 40u);
  EXPECT_GE(s.pinned_copies, 40u);
  EXPECT_LE(s.peak_pinned_bytes, 14 * MiB);
  // Another line's buffers of the same size, never copied, get none of the pool's.
  void* other = pinner->allocate(batch, false, 43);
  EXPECT_FALSE(driver.covers(other));
}

TEST_F(PinnerTest, PinnedBytesStayUnderTheCap) {
  settings.cap_bytes = 40 * MiB;
  make();
  std::vector<void*> live;
  for (int i = 0; i < 4; ++i) {
    live.push_back(pinner->allocate(16 * MiB, false, 1));
    for (int k = 0; k < 4; ++k) copy(live.back(), 16 * MiB);
  }
  const auto s = pinner->stats();
  EXPECT_EQ(s.registrations, 2u);
  EXPECT_LE(s.peak_pinned_bytes, 40 * MiB);
  EXPECT_GT(s.declined_for_cap, 0u);
}

TEST_F(PinnerTest, TheCapTakesThePoolsLeastRecentlyUsedFirst) {
  settings.cap_bytes = 40 * MiB;
  make();
  // Two lines whose buffers are copied often, freed into the pool.
  void* a = pinner->allocate(16 * MiB, false, 1);
  for (int k = 0; k < 4; ++k) copy(a, 16 * MiB);
  void* b = pinner->allocate(16 * MiB, false, 2);
  for (int k = 0; k < 4; ++k) copy(b, 16 * MiB);
  pinner->release(a);
  pinner->release(b);
  ASSERT_EQ(driver.ranges.size(), 2u);
  // A third, live, needs room: the older of the two freed (a) goes.
  void* c = pinner->allocate(20 * MiB, false, 3);
  for (int k = 0; k < 4; ++k) copy(c, 20 * MiB);
  EXPECT_TRUE(driver.covers(c));
  EXPECT_FALSE(driver.ranges.count(a));
  EXPECT_TRUE(driver.ranges.count(b));
}

TEST_F(PinnerTest, DiscardingPagesUnregistersFirst) {
  void* p = pinner->allocate(16 * MiB, false, 1);
  for (int k = 0; k < 3; ++k) copy(p, 16 * MiB);
  ASSERT_TRUE(driver.covers(p));
  // madvise(MADV_DONTNEED) of a page in the middle: the whole buffer is unregistered.
  pinner->unmapping(static_cast<char*>(p) + 8 * MiB, 4096);
  EXPECT_FALSE(driver.covers(p));
  EXPECT_EQ(pinner->stats().unregistrations, 1u);
  // What its copies saved so far still stands: the next copy registers its new pages.
  EXPECT_TRUE(copy(p, 16 * MiB));
  EXPECT_TRUE(driver.covers(p));
  EXPECT_EQ(pinner->stats().registrations, 2u);
  // Ranges outside the library's memory are none of its business.
  char stack_buffer[64];
  pinner->unmapping(stack_buffer, sizeof stack_buffer);
}

TEST_F(PinnerTest, AFreedBufferOfALineThatStoppedCopyingIsUnregisteredBeforeItsMemoryGoesBack) {
  void* hot = pinner->allocate(16 * MiB, false, 5);
  for (int k = 0; k < 3; ++k) copy(hot, 16 * MiB);
  // The same line's later buffers are never copied: it no longer copies.
  for (int i = 0; i < 3; ++i) pinner->release(pinner->allocate(16 * MiB, false, 5));
  ASSERT_TRUE(driver.covers(hot));
  pinner->release(hot);
  EXPECT_FALSE(driver.covers(hot));
  EXPECT_TRUE(driver.ranges.empty());
}

TEST_F(PinnerTest, ReallocKeepsTheContentsAndNeverMovesAPinnedRange) {
  auto* p = static_cast<unsigned char*>(pinner->allocate(4 * MiB, false, 9));
  std::memset(p, 0x5a, 4 * MiB);
  for (int k = 0; k < 8; ++k) copy(p, 4 * MiB);
  ASSERT_TRUE(driver.covers(p));
  auto* q = static_cast<unsigned char*>(pinner->reallocate(p, 32 * MiB));
  ASSERT_NE(q, nullptr);
  for (size_t i = 0; i < 4 * MiB; i += 4096) ASSERT_EQ(q[i], 0x5a);
  // Every registered range is still one of the library's live or pooled buffers.
  for (auto& [base, bytes] : driver.ranges) EXPECT_GE(pinner->usable_size(base), bytes);
  // Unpinned, realloc moves the pages themselves.
  auto* r = static_cast<unsigned char*>(pinner->allocate(4 * MiB, false, 10));
  std::memset(r, 0x33, 4 * MiB);
  auto* s = static_cast<unsigned char*>(pinner->reallocate(r, 64 * MiB));
  ASSERT_NE(s, nullptr);
  for (size_t i = 0; i < 4 * MiB; i += 4096) ASSERT_EQ(s[i], 0x33);
  EXPECT_EQ(s[40 * MiB], 0);
}

TEST_F(PinnerTest, AForkedChildMakesNoDriverCall) {
  void* p = pinner->allocate(16 * MiB, false, 1);
  for (int k = 0; k < 3; ++k) copy(p, 16 * MiB);
  const int before = driver.calls;
  pinner->lock();
  pinner->forked_child();
  pinner->unlock();
  pinner->release(p);
  for (int i = 0; i < 5; ++i) {
    void* q = pinner->allocate(16 * MiB, false, 1);
    for (int k = 0; k < 4; ++k) EXPECT_FALSE(copy(q, 16 * MiB));
    pinner->release(q);
  }
  EXPECT_EQ(driver.calls, before);
}

TEST_F(PinnerTest, NoPinningBeforeTheProgramUsesCuda) {
  driver.usable_now = false;
  void* p = pinner->allocate(16 * MiB, false, 1);
  for (int k = 0; k < 4; ++k) EXPECT_FALSE(copy(p, 16 * MiB));
  EXPECT_EQ(driver.calls, 0);
}

TEST_F(PinnerTest, ThreeFailedRegistrationsLeaveTheProgramToTheCLibrary) {
  driver.answer = Driver::Result::failed;
  void* p = pinner->allocate(16 * MiB, false, 1);
  ASSERT_NE(p, nullptr);
  for (int k = 0; k < 6; ++k) EXPECT_FALSE(copy(p, 16 * MiB));
  EXPECT_EQ(driver.calls, 3);
  EXPECT_TRUE(pinner->stats().registration_disabled);
  // Its buffers stay its own until freed; new ones are the C library's.
  EXPECT_EQ(pinner->allocate(16 * MiB, false, 2), nullptr);
  pinner->release(p);
}

TEST_F(PinnerTest, ABufferTheProgramRegisteredIsLeftToIt) {
  driver.answer = Driver::Result::already;
  void* p = pinner->allocate(16 * MiB, false, 1);
  for (int k = 0; k < 6; ++k) EXPECT_FALSE(copy(p, 16 * MiB));
  EXPECT_EQ(driver.calls, 1);  // tried once
  EXPECT_EQ(pinner->stats().other_copies, 5u);
}

TEST_F(PinnerTest, ModeAllPinsAtAllocationAndOffNever) {
  settings.mode = Mode::all;
  make();
  void* p = pinner->allocate(16 * MiB, false, 1);
  EXPECT_TRUE(driver.covers(p));
  settings.mode = Mode::off;
  KeptRanges none;
  Pinner off(settings, advise::builtin_copy_model(), none);
  void* q = off.allocate(16 * MiB, false, 1);
  for (int k = 0; k < 10; ++k) off.on_copy(q, 16 * MiB, true);
  EXPECT_EQ(none.calls, 0);
}

TEST_F(PinnerTest, CallocFromReusedMemoryIsZero) {
  auto* p = static_cast<unsigned char*>(pinner->allocate(1 * MiB, false, 1));
  std::memset(p, 0xff, 1 * MiB);
  pinner->release(p);
  auto* q = static_cast<unsigned char*>(pinner->allocate(1 * MiB, true, 1));
  ASSERT_EQ(q, p);  // from the cache
  for (size_t i = 0; i < 1 * MiB; i += 512) ASSERT_EQ(q[i], 0);
}

}  // namespace
}  // namespace gpuscope::pin
