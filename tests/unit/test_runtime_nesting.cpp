// Runtime calls made inside other runtime calls (libcudart's cudaMemcpyArrayToArray calls its own
// cudaMemcpyFromArray and cudaMemcpyToArray through their exported names, so their probes fire):
// children of the call around them, as the driver calls inside runtime calls are, without
// disturbing which runtime functions the driver's probes can stand for, nor launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "decode/decoder.h"
#include "decode/tracker.h"

using namespace gpuscope;
using namespace gpuscope::decode;
using namespace gpuscope::cuda;

namespace {

// A call record as the BPF side sends it: under_runtime when a runtime call was pending on the
// thread at its entry (GS_CALL_UNDER_RUNTIME; such a call takes no stack).
CallEvent call(std::string_view symbol, std::initializer_list<uint64_t> args, uint64_t ts, uint64_t dur,
               bool under_runtime = false, int64_t stack_id = 0) {
  gs_call_record r{};
  const FunctionSpec* f = function_by_symbol(symbol);
  EXPECT_NE(f, nullptr) << symbol;
  r.kind = GS_REC_CALL;
  r.func = f ? f->id : 0;
  r.flags = (f && f->has_return ? GS_CALL_HAS_RETURN : 0) | (under_runtime ? GS_CALL_UNDER_RUNTIME : 0);
  r.ts_ns = ts;
  r.duration_ns = f && f->has_return ? dur : 0;
  r.pid = 42;
  r.tid = 7;
  size_t i = 0;
  for (uint64_t a : args) r.args[i++] = a;
  std::strcpy(r.comm, "test");
  CallEvent e;
  EXPECT_TRUE(decode_call(r, e));
  e.stack_id = stack_id;
  return e;
}

constexpr uint64_t kArrayA = 0xa000, kArrayB = 0xb000, kStaging = 0x700000000000;
constexpr uint64_t kDtoD = 3;  // cudaMemcpyDeviceToDevice

uint16_t id_of(std::string_view symbol) { return function_by_symbol(symbol)->id; }

class RuntimeNesting : public ::testing::Test {
 protected:
  Tracker t{true};
  std::vector<CallEvent> out;
  std::function<void(CallEvent&)> emit = [this](CallEvent& e) { out.push_back(e); };

  // cudaMemcpyArrayToArray [ts, ts + 100] of `bytes`, as libcudart makes it: cudaMemcpyFromArray
  // [ts + 10, ts + 50] (cuMemcpyAtoD_v2 inside) into a staging buffer, then cudaMemcpyToArray
  // [ts + 60, ts + 90] (cuMemcpyDtoA_v2 inside). Records come at returns: innermost first.
  // With `inner_runtime` false, the runtime's own functions are not probed (their probes gone):
  // the driver copies are directly inside.
  void array_to_array(uint64_t ts, uint64_t bytes, int64_t stack_id, bool inner_runtime = true) {
    t.process(call("cuMemcpyAtoD_v2", {kStaging, kArrayA, 0, bytes}, ts + 20, 20, true), emit);
    if (inner_runtime)
      t.process(call("cudaMemcpyFromArray", {kStaging, kArrayA, 0, 0, bytes, kDtoD}, ts + 10, 40, true), emit);
    t.process(call("cuMemcpyDtoA_v2", {kArrayB, 0, kStaging, bytes}, ts + 70, 10, true), emit);
    if (inner_runtime)
      t.process(call("cudaMemcpyToArray", {kArrayB, 0, 0, kStaging, bytes, kDtoD}, ts + 60, 30, true), emit);
    t.process(call("cudaMemcpyArrayToArray", {kArrayB, 0, 0, kArrayA, 0, 0, bytes, kDtoD}, ts, 100, false, stack_id),
              emit);
  }

  const CallEvent& row(std::string_view symbol, size_t nth = 0) {
    for (const auto& e : out)
      if (e.func == id_of(symbol) && nth-- == 0) return e;
    ADD_FAILURE() << "no row " << symbol;
    return out.front();
  }
};

}  // namespace

TEST(RuntimeNestingDecode, UnderRuntimeFlagIsDecoded) {
  EXPECT_TRUE(call("cudaMemcpyFromArray", {}, 1, 1, true).under_runtime);
  EXPECT_FALSE(call("cudaMemcpyFromArray", {}, 1, 1, false).under_runtime);
}

TEST_F(RuntimeNesting, ARuntimeCallInsideARuntimeCallIsItsChild) {
  // A driver copy the program made itself before, not inside anything.
  t.process(call("cuMemcpyDtoD_v2", {kStaging, kStaging + 4096, 64}, 10, 5, false, 9), emit);
  array_to_array(100, 1280, 42);
  ASSERT_EQ(out.size(), 6u);
  const CallEvent& outer = row("cudaMemcpyArrayToArray");
  EXPECT_EQ(outer.parent_id, 0);
  EXPECT_EQ(outer.bytes, 1280u);
  EXPECT_EQ(outer.dir, CopyDir::DeviceToDevice);
  EXPECT_EQ(outer.stack_id, 42);
  const CallEvent &from = row("cudaMemcpyFromArray"), &to = row("cudaMemcpyToArray");
  EXPECT_EQ(from.parent_id, outer.call_id);
  EXPECT_EQ(to.parent_id, outer.call_id);
  // Each driver copy is the child of the innermost runtime call around it.
  EXPECT_EQ(row("cuMemcpyAtoD_v2").parent_id, from.call_id);
  EXPECT_EQ(row("cuMemcpyDtoA_v2").parent_id, to.call_id);
  // None took a stack of its own: each has the program's call's.
  for (const char* inner : {"cudaMemcpyFromArray", "cudaMemcpyToArray", "cuMemcpyAtoD_v2", "cuMemcpyDtoA_v2"})
    EXPECT_EQ(row(inner).stack_id, 42) << inner;
  // The copy before stays top-level with its own stack.
  EXPECT_EQ(row("cuMemcpyDtoD_v2").parent_id, 0);
  EXPECT_EQ(row("cuMemcpyDtoD_v2").stack_id, 9);
  // One top-level row for the one copy the program asked for.
  int top_level = 0;
  for (const auto& e : out) top_level += e.parent_id == 0;
  EXPECT_EQ(top_level, 2);
}

TEST_F(RuntimeNesting, InnerCallsWaitForTheCallAroundThem) {
  t.process(call("cuMemcpyAtoD_v2", {kStaging, kArrayA, 0, 64}, 120, 20, true), emit);
  t.process(call("cudaMemcpyFromArray", {kStaging, kArrayA, 0, 0, 64, kDtoD}, 110, 40, true), emit);
  t.process(call("cuMemcpyDtoA_v2", {kArrayB, 0, kStaging, 64}, 170, 10, true), emit);
  t.process(call("cudaMemcpyToArray", {kArrayB, 0, 0, kStaging, 64, kDtoD}, 160, 30, true), emit);
  EXPECT_TRUE(out.empty());  // the call around them has not returned
  t.process(call("cudaMemcpyArrayToArray", {kArrayB, 0, 0, kArrayA, 0, 0, 64, kDtoD}, 100, 100), emit);
  EXPECT_EQ(out.size(), 5u);
}

TEST_F(RuntimeNesting, AnInnerCallWhoseOuterReturnWasMissedIsHandedOnTopLevel) {
  // The runtime call around it was pending at its entry, but its return never came (its probes
  // removed meanwhile): the next top-level runtime call, which does not enclose it, hands it on.
  t.process(call("cudaMemcpyFromArray", {kStaging, kArrayA, 0, 0, 64, kDtoD}, 110, 40, true), emit);
  EXPECT_TRUE(out.empty());
  t.process(call("cudaMemcpy", {kStaging, kStaging + 64, 64, kDtoD}, 1000, 10, false, 5), emit);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].func, id_of("cudaMemcpyFromArray"));
  EXPECT_EQ(out[0].parent_id, 0);
  EXPECT_EQ(out[0].stack_id, 0);  // not inside the later call: not given its stack
  EXPECT_EQ(out[1].parent_id, 0);
  // And flush hands on one still held at the end.
  t.process(call("cudaMemcpyToArray", {kArrayB, 0, 0, kStaging, 64, kDtoD}, 2000, 30, true), emit);
  t.flush(emit);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].func, id_of("cudaMemcpyToArray"));
}

TEST_F(RuntimeNesting, ACallStagedAsTwoCopiesIsNeverLeftToTheDriver) {
  t.note_driver_probed(42, 0);
  for (uint64_t i = 0; i < 2 * Tracker::kRedundantAfter; ++i) array_to_array(1000 * (i + 1), 1280, 42);
  // Each inner call made one driver copy of its kind: the driver's probes can stand for them.
  // The outer one made two copies: no single driver call stands for it, its probes stay.
  auto redundant = t.take_redundant_runtime_functions();
  std::sort(redundant.begin(), redundant.end());
  std::vector<uint16_t> want{id_of("cudaMemcpyToArray"), id_of("cudaMemcpyFromArray")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(redundant, want);

  // Its inner functions' probes gone, its two driver copies are directly inside it: still two.
  Tracker u(true);
  std::swap(t, u);
  t.note_driver_probed(42, 0);
  for (uint64_t i = 0; i < 2 * Tracker::kRedundantAfter; ++i) array_to_array(1000 * (i + 1), 1280, 42, false);
  EXPECT_TRUE(t.take_redundant_runtime_functions().empty());

  // A runtime call that wraps one driver call is still found once, nested calls or not.
  Tracker v(true);
  std::swap(t, v);
  for (uint64_t i = 0; i < Tracker::kRedundantAfter; ++i) {
    const uint64_t ts = 1000 * (i + 1);
    t.process(call("cuMemsetD8Async", {0x7000, 7, 4096, 0}, ts + 2, 5, true), emit);
    t.process(call("cudaMemsetAsync", {0x7000, 7, 4096, 0}, ts, 10), emit);
  }
  EXPECT_EQ(t.take_redundant_runtime_functions(), std::vector<uint16_t>{id_of("cudaMemsetAsync")});
}

TEST_F(RuntimeNesting, ARuntimeCopyOfUnknownBytesTakesOnlyItsOwnDriverCopies) {
  // A copy in the elements of an array not seen created takes the bytes of the driver copies
  // directly inside it; those inside a runtime call inside it are that call's.
  t.process(call("cuMemcpy3D_v2", {0x7ffd0000}, 120, 10, true), emit);
  CallEvent inner = call("cudaMemcpyFromArray", {kStaging, kArrayA, 0, 0, 64, kDtoD}, 110, 40, true);
  t.process(inner, emit);
  CallEvent outer = call("cudaMemcpyArrayToArray", {kArrayB, 0, 0, kArrayA, 0, 0, 64, kDtoD}, 100, 100);
  outer.bytes = 0;
  outer.bytes_known = false;
  t.process(outer, emit);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FALSE(row("cudaMemcpyArrayToArray").bytes_known);  // no driver copy directly inside
  EXPECT_EQ(row("cuMemcpy3D_v2").parent_id, row("cudaMemcpyFromArray").call_id);
}

TEST_F(RuntimeNesting, LaunchesAroundNestedCallsStayOneRowEach) {
  // A runtime launch (entry only) and the driver launch it made (flagged by call_entry_emit),
  // after and before a nested copy: one launch row each, top-level, the driver's folded in.
  auto reg = call("__cudaRegisterFunction", {0, 0x401000, 0, 0}, 1, 0);
  t.process(reg, emit);
  t.process(call("cudaLaunchKernel", {0x401000, 1, 1, 1, 1, 0, 0, 0}, 10, 0, false, 3), emit);
  t.process(call("cuLaunchKernel", {0xf00, 1, 1, 1, 1, 1, 1, 0, 0}, 11, 0, true), emit);
  array_to_array(100, 1280, 42);
  t.process(call("cudaLaunchKernel", {0x401000, 1, 1, 1, 1, 0, 0, 0}, 300, 0, false, 4), emit);
  t.process(call("cuLaunchKernel", {0xf00, 1, 1, 1, 1, 1, 1, 0, 0}, 301, 0, true), emit);
  t.flush(emit);
  std::vector<const CallEvent*> launches;
  for (const auto& e : out)
    if (function_by_id(e.func)->kind == CallKind::Launch) launches.push_back(&e);
  ASSERT_EQ(launches.size(), 2u);
  for (const CallEvent* l : launches) {
    EXPECT_EQ(l->func, id_of("cudaLaunchKernel"));
    EXPECT_EQ(l->driver_func, id_of("cuLaunchKernel"));
    EXPECT_EQ(l->parent_id, 0);
  }
  EXPECT_EQ(launches[0]->stack_id, 3);
  EXPECT_EQ(launches[1]->stack_id, 4);
  EXPECT_EQ(row("cudaMemcpyToArray").parent_id, row("cudaMemcpyArrayToArray").call_id);
}
