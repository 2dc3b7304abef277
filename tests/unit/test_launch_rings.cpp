// The launch rings' reader (record/launch_rings.h) on rings laid out in memory as the hooks lay
// them out: records come in order and only once published, the slots are reused past the end,
// what the writers lost is counted, and anything that is not a ring is refused.
#include <gtest/gtest.h>

#include <time.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/model.h"
#include "cuda/functions.h"
#include "decode/decoder.h"
#include "record/launch_rings.h"
#include "record/tsc_clock.h"

using namespace gpuscope;

namespace {

struct MemoryRing {
  static constexpr uint32_t kNamesBytes = 256;
  std::vector<uint64_t> words;  // 8-byte aligned
  explicit MemoryRing(uint32_t slots, uint32_t pid = 77)
      : words((sizeof(gs_launch_ring_header) + slots * sizeof(gs_launch_record) + kNamesBytes) / 8) {
    std::memcpy(header()->magic, GS_LAUNCH_RING_MAGIC, 8);
    header()->version = GS_LAUNCH_RING_VERSION;
    header()->record_size = sizeof(gs_launch_record);
    header()->slots = slots;
    header()->pid = pid;
    header()->names_offset = uint32_t(sizeof(gs_launch_ring_header) + slots * sizeof(gs_launch_record));
    header()->names_bytes = kNamesBytes;
  }
  // As the hooks name a function: reserve, fill, mark ready (or not); false when it does not fit.
  gs_launch_name* name(uint64_t function, const std::string& text, bool ready = true) {
    const uint64_t size = GS_LAUNCH_NAME_SIZE(text.size());
    const uint64_t at = header()->names_head;
    header()->names_head += size;
    if (at + size > header()->names_bytes) {
      ++header()->names_lost;
      return nullptr;
    }
    auto* e = reinterpret_cast<gs_launch_name*>(reinterpret_cast<char*>(words.data()) + header()->names_offset + at);
    e->function = function;
    e->length = uint32_t(text.size());
    std::memcpy(e->name, text.c_str(), text.size() + 1);
    e->ready = ready;
    return e;
  }
  gs_launch_ring_header* header() { return reinterpret_cast<gs_launch_ring_header*>(words.data()); }
  gs_launch_record* slots() { return reinterpret_cast<gs_launch_record*>(header() + 1); }
  size_t bytes() const { return words.size() * 8; }
  // As a writer does: reserve the next position, fill the slot, publish it (or not).
  uint64_t write(uint64_t function, bool publish = true) {
    const uint64_t pos = header()->head++;
    auto& r = slots()[pos & (header()->slots - 1)];
    r.function = function;
    r.ts_ns = 1000 + pos;
    r.api = GS_LAUNCH_CU_LAUNCH_KERNEL;
    if (publish) r.seq = pos + 1;
    return pos;
  }
};

std::vector<uint64_t> drain(record::LaunchRings& rings) {
  std::vector<uint64_t> got;
  rings.drain([&](uint32_t pid, const gs_launch_record& r) {
    EXPECT_EQ(pid, 77u);
    got.push_back(r.function);
  });
  return got;
}

}  // namespace

TEST(LaunchRings, RecordsComeInOrderOnceEachAndTheSlotsAreReused) {
  MemoryRing m(4);
  record::LaunchRings rings("");
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  EXPECT_EQ(m.header()->reader_pid, uint32_t(getpid()));  // the writers know a reader is there
  for (uint64_t f : {10, 11, 12}) m.write(f);
  EXPECT_EQ(drain(rings), (std::vector<uint64_t>{10, 11, 12}));
  EXPECT_EQ(m.header()->tail, 3u);
  EXPECT_TRUE(drain(rings).empty());
  // Past the end of the slots: positions 3..6 in slots 3, 0, 1, 2.
  for (uint64_t f : {13, 14, 15, 16}) m.write(f);
  EXPECT_EQ(drain(rings), (std::vector<uint64_t>{13, 14, 15, 16}));
  EXPECT_EQ(m.header()->tail, 7u);
}

TEST(LaunchRings, AReservedSlotNotYetPublishedHoldsBackWhatComesAfterIt) {
  MemoryRing m(8);
  record::LaunchRings rings("");
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  m.write(1);
  const uint64_t pending = m.write(2, false);
  m.write(3);
  EXPECT_EQ(drain(rings), (std::vector<uint64_t>{1}));
  EXPECT_EQ(m.header()->tail, 1u);  // slot 1 is not free yet
  m.slots()[pending].seq = pending + 1;
  EXPECT_EQ(drain(rings), (std::vector<uint64_t>{2, 3}));
}

TEST(LaunchRings, ADrainUpToATimeLeavesTheCallsEnteredAfterItForTheNext) {
  MemoryRing m(8);
  record::LaunchRings rings("");
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  for (uint64_t f = 1; f <= 4; ++f) m.write(f);  // entered at 1000..1003
  std::vector<uint64_t> got;
  rings.drain([&](uint32_t, const gs_launch_record& r) { got.push_back(r.function); }, 1001);
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(m.header()->tail, 2u);  // their slots are free again; the others' are not
  EXPECT_EQ(drain(rings), (std::vector<uint64_t>{3, 4}));
}

namespace {
uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}
}  // namespace

TEST(TscClock, TicksReadAsTheMonotonicClock) {
  record::TscClock c;
  const uint64_t t0 = record::TscClock::read_tsc();
  const uint64_t n0 = monotonic_ns();
  const timespec pause{0, 20'000'000};
  nanosleep(&pause, nullptr);
  c.sample();
  const uint64_t t1 = record::TscClock::read_tsc();
  const uint64_t n1 = monotonic_ns();
  // Within 50 us of the clock (a loaded machine may deschedule between the two reads).
  EXPECT_NEAR(double(c.to_ns(t0)), double(n0), 50'000);
  EXPECT_NEAR(double(c.to_ns(t1)), double(n1), 50'000);
  EXPECT_NEAR(double(c.span_ns(t1 - t0)), double(n1 - n0), 0.01 * double(n1 - n0) + 50'000);
}

TEST(LaunchRings, ARingTimedWithTheTscIsReadInNanoseconds) {
  MemoryRing m(4);
  m.header()->clock = GS_LAUNCH_CLOCK_TSC;
  record::LaunchRings rings("");
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  const uint64_t pos = m.write(1, false);
  auto& slot = m.slots()[pos];
  const uint64_t t0 = record::TscClock::read_tsc();
  const uint64_t n0 = monotonic_ns();
  const timespec pause{0, 5'000'000};
  nanosleep(&pause, nullptr);
  slot.ts_ns = t0;
  slot.duration_ns = uint32_t(record::TscClock::read_tsc() - t0);
  const uint64_t n1 = monotonic_ns();
  slot.seq = pos + 1;
  std::vector<gs_launch_record> got;
  rings.drain([&](uint32_t, const gs_launch_record& r) { got.push_back(r); });
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NEAR(double(got[0].ts_ns), double(n0), 50'000);
  EXPECT_NEAR(double(got[0].duration_ns), double(n1 - n0), 0.02 * double(n1 - n0) + 50'000);
  // As a launch handed to the probe is read.
  gs_launch_record marker = slot;
  ASSERT_TRUE(rings.times_to_ns(77, marker));
  EXPECT_EQ(marker.ts_ns, got[0].ts_ns);
  EXPECT_FALSE(rings.times_to_ns(78, marker));
  // A clock it does not know: not a ring.
  MemoryRing other(4, 79);
  other.header()->clock = 7;
  EXPECT_FALSE(rings.adopt(79, other.words.data(), other.bytes(), false));
}

TEST(LaunchRings, AStaleSlotFromTheLastLapIsNotReadAgain) {
  MemoryRing m(4);
  record::LaunchRings rings("");
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  for (uint64_t f : {1, 2, 3, 4}) m.write(f);
  EXPECT_EQ(drain(rings).size(), 4u);
  // Position 4 reserved in slot 0, still holding position 0's record (seq 1, not 5).
  m.write(5, false);
  EXPECT_TRUE(drain(rings).empty());
}

TEST(LaunchRings, WhatTheWritersLostIsCountedAlsoOnceTheProcessIsGone) {
  MemoryRing a(4), b(4, 78);
  record::LaunchRings rings("");
  ASSERT_TRUE(rings.adopt(77, a.words.data(), a.bytes(), false));
  ASSERT_TRUE(rings.adopt(78, b.words.data(), b.bytes(), false));
  a.header()->lost = 5;
  b.header()->lost = 2;
  EXPECT_EQ(rings.lost(), 7u);
  a.write(9);
  std::vector<uint64_t> last;
  rings.forget(77, [&](uint32_t, const gs_launch_record& r) { last.push_back(r.function); });
  EXPECT_EQ(last, (std::vector<uint64_t>{9}));  // drained before it goes
  EXPECT_EQ(rings.rings(), 1u);
  EXPECT_EQ(rings.lost(), 7u);
}

TEST(LaunchRings, WhatIsNotARingIsRefused) {
  record::LaunchRings rings("");
  auto refused = [&](auto spoil) {
    MemoryRing m(4);
    spoil(m);
    return !rings.adopt(77, m.words.data(), m.bytes(), false);
  };
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->magic[0] = 'X'; }));
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->version = 99; }));
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->record_size = 32; }));
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->slots = 3; }));  // not a power of two
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->slots = 1u << 20; }));  // past the mapping
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->pid = 5; }));  // another process's
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->names_offset += 64; }));  // names past the mapping
  EXPECT_TRUE(refused([](MemoryRing& m) { m.header()->names_bytes = 100; }));   // not whole entries' room
  EXPECT_EQ(rings.refused(), 8u);
  EXPECT_EQ(rings.rings(), 0u);
  MemoryRing small(4);
  EXPECT_FALSE(rings.adopt(77, small.words.data(), sizeof(gs_launch_ring_header) - 8, false));
}

TEST(LaunchRings, ALaunchReadsAsTheDriverProbesWouldHaveRecordedIt) {
  gs_launch_record r{};
  r.ts_ns = 5000;
  r.duration_ns = 700;
  r.function = 0xabc0;
  r.stream = 0x55;
  r.tid = 91;
  r.grid_x = 70000, r.grid_y = 2, r.grid_z = 3;
  r.block_x = 128, r.block_y = 4, r.block_z = 1;
  r.shared_mem = 4096;
  r.result = 0;
  for (uint16_t api : {GS_LAUNCH_CU_LAUNCH_KERNEL_PTSZ, GS_LAUNCH_CU_LAUNCH_KERNEL_EX, GS_LAUNCH_CU_GRAPH_LAUNCH}) {
    r.api = api;
    gs_call_record rec;
    ASSERT_TRUE(record::LaunchRings::to_call_record(90, r, "python3", rec));
    CallEvent e;
    ASSERT_TRUE(decode::decode_call(rec, e, {}));
    const auto* f = cuda::function_by_id(e.func);
    EXPECT_EQ(f->api, cuda::Api::Driver);
    EXPECT_EQ(e.pid, 90u);
    EXPECT_EQ(e.tid, 91u);
    EXPECT_EQ(e.ts_ns, 5000u);
    EXPECT_EQ(e.duration_ns, 700u);
    EXPECT_TRUE(e.has_return);
    EXPECT_EQ(e.comm, "python3");
    EXPECT_EQ(e.kernel_handle, 0xabc0u);
    EXPECT_EQ(e.stream, 0x55u);
    if (api == GS_LAUNCH_CU_GRAPH_LAUNCH) {
      EXPECT_EQ(f->symbol, "cuGraphLaunch");
      continue;
    }
    EXPECT_EQ(f->symbol, api == GS_LAUNCH_CU_LAUNCH_KERNEL_EX ? "cuLaunchKernelEx" : "cuLaunchKernel_ptsz");
    EXPECT_EQ(e.grid[0], 70000u);
    EXPECT_EQ(e.grid[2], 3u);
    EXPECT_EQ(e.block[0], 128u);
    EXPECT_EQ(e.block[1], 4u);
    EXPECT_EQ(e.shared_mem, 4096u);
  }
  // cuKernelGetFunction: the kernel asked about and the function the driver wrote.
  r.api = GS_LAUNCH_CU_KERNEL_GET_FUNCTION;
  r.function = 0x7000;
  r.stream = 0x7001;
  for (uint16_t result : {0, 500}) {
    r.result = result;
    gs_call_record rec;
    ASSERT_TRUE(record::LaunchRings::to_call_record(90, r, "python3", rec));
    CallEvent e;
    ASSERT_TRUE(decode::decode_call(rec, e, {}));
    EXPECT_EQ(cuda::function_by_id(e.func)->symbol, "cuKernelGetFunction");
    EXPECT_EQ(e.kernel_handle, 0x7000u);
    EXPECT_EQ(e.out_valid, result == 0);
    if (!result) EXPECT_EQ(e.out_handle, 0x7001u);
    EXPECT_EQ(e.stream, 0u);
  }
  r.api = 0;
  gs_call_record rec;
  EXPECT_FALSE(record::LaunchRings::to_call_record(90, r, "x", rec));
  r.api = 200;
  EXPECT_FALSE(record::LaunchRings::to_call_record(90, r, "x", rec));
}

TEST(LaunchRings, AHeaderRewrittenAfterItWasCheckedIsNotBelieved) {
  MemoryRing m(4);
  record::LaunchRings rings("");
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  for (uint64_t f : {1, 2, 3, 4}) m.write(f);
  // The process claims a bigger ring: reading by that would run past the mapping.
  m.header()->slots = 1u << 20;
  EXPECT_EQ(drain(rings), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(LaunchRings, NamesComeBeforeTheLaunchesReadWithThemAndOnlyWhole) {
  MemoryRing m(8);
  record::LaunchRings rings("");
  std::vector<std::string> events;
  rings.on_name([&](uint32_t pid, uint64_t function, std::string_view name) {
    EXPECT_EQ(pid, 77u);
    events.push_back(std::to_string(function) + "=" + std::string(name));
  });
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  m.name(0x10, "_Z6kernelPf");
  m.write(0x10);
  gs_launch_name* pending = m.name(0x20, "being_written", false);
  m.name(0x30, "after_it");
  m.write(0x20);
  rings.drain([&](uint32_t, const gs_launch_record& r) { events.push_back("launch " + std::to_string(r.function)); });
  // The name being written holds back those after it, not the launches.
  EXPECT_EQ(events, (std::vector<std::string>{"16=_Z6kernelPf", "launch 16", "launch 32"}));
  events.clear();
  pending->ready = 1;
  drain(rings);
  EXPECT_EQ(events, (std::vector<std::string>{"32=being_written", "48=after_it"}));
  EXPECT_EQ(rings.names(), 3u);
  // A full area: counted by the writer, and what did fit stays readable.
  EXPECT_EQ(m.name(0x40, std::string(300, 'x')), nullptr);
  EXPECT_EQ(rings.names_lost(), 1u);
}

TEST(LaunchRings, ANameEntryThatDoesNotReadAsOneEndsTheNamesNotTheLaunches) {
  MemoryRing m(4);
  record::LaunchRings rings("");
  std::vector<std::string> names;
  rings.on_name([&](uint32_t, uint64_t, std::string_view name) { names.emplace_back(name); });
  ASSERT_TRUE(rings.adopt(77, m.words.data(), m.bytes(), false));
  m.name(0x10, "first");
  m.name(0x20, "second")->length = 100000;  // runs past the area
  m.name(0x30, "third");
  m.write(0x10);
  EXPECT_EQ(drain(rings), (std::vector<uint64_t>{0x10}));
  EXPECT_EQ(names, (std::vector<std::string>{"first"}));
}
