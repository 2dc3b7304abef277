// Decoding raw call records and the tracker's cross-call state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>

#include "decode/decoder.h"
#include "decode/nccl.h"
#include "decode/tracker.h"

using namespace gpuscope;
using namespace gpuscope::decode;
using namespace gpuscope::cuda;

namespace {

gs_call_record raw(std::string_view symbol, std::initializer_list<uint64_t> args, uint64_t ts = 1000,
                   uint64_t dur = 10, int64_t ret = 0, uint32_t tid = 7) {
  gs_call_record r{};
  const FunctionSpec* f = function_by_symbol(symbol);
  EXPECT_NE(f, nullptr) << symbol;
  r.kind = GS_REC_CALL;
  r.func = f->id;
  r.flags = f->has_return ? GS_CALL_HAS_RETURN : 0;
  r.ts_ns = ts;
  r.duration_ns = f->has_return ? dur : 0;
  r.pid = 42;
  r.tid = tid;
  r.ret = ret;
  size_t i = 0;
  for (uint64_t a : args) r.args[i++] = a;
  std::strcpy(r.comm, "test");
  return r;
}

CallEvent decoded(const gs_call_record& r) {
  CallEvent e;
  EXPECT_TRUE(decode_call(r, e));
  return e;
}

uint64_t pack(uint32_t lo, uint32_t hi) { return uint64_t(hi) << 32 | lo; }

}  // namespace

TEST(Decode, RuntimeLaunchUnpacksDim3RegistersAndStackArguments) {
  // cudaLaunchKernel(func, dim3 grid, dim3 block, args, shmem, stream): dim3 travels in two registers.
  auto r = raw("cudaLaunchKernel", {0x401000, pack(4, 2), 1, pack(128, 1), 1, 0x7ff0, 256, 0xabc});
  auto e = decoded(r);
  EXPECT_EQ(e.kernel_handle, 0x401000u);
  EXPECT_EQ(e.grid[0], 4u);
  EXPECT_EQ(e.grid[1], 2u);
  EXPECT_EQ(e.grid[2], 1u);
  EXPECT_EQ(e.block[0], 128u);
  EXPECT_EQ(e.block[1], 1u);
  EXPECT_EQ(e.shared_mem, 256u);
  EXPECT_EQ(e.stream, 0xabcu);
  EXPECT_FALSE(e.has_return);
}

TEST(Decode, DriverLaunchReadsNinthArgumentFromStack) {
  auto e = decoded(raw("cuLaunchKernel", {0xf00, 10, 20, 30, 64, 2, 1, 512, 0x5}));
  EXPECT_EQ(e.kernel_handle, 0xf00u);
  EXPECT_EQ(e.grid[2], 30u);
  EXPECT_EQ(e.block[2], 1u);
  EXPECT_EQ(e.shared_mem, 512u);
  EXPECT_EQ(e.stream, 0x5u);
}

TEST(Decode, LaunchExReadsConfigStruct) {
  auto r = raw("cudaLaunchKernelExC", {0x1000, 0x401000, 0});
  uint32_t dims[6] = {3, 2, 1, 32, 4, 1};
  std::memcpy(r.deref, dims, sizeof(dims));
  uint64_t smem = 1024, stream = 0x77;
  std::memcpy(r.deref + 24, &smem, 8);
  std::memcpy(r.deref + 32, &stream, 8);
  r.flags |= GS_CALL_DEREF_OK;
  auto e = decoded(r);
  EXPECT_EQ(e.kernel_handle, 0x401000u);
  EXPECT_EQ(e.grid[0], 3u);
  EXPECT_EQ(e.block[1], 4u);
  EXPECT_EQ(e.shared_mem, 1024u);
  EXPECT_EQ(e.stream, 0x77u);
}

TEST(Decode, MallocTakesPointerFromOutArgumentOnlyOnSuccess) {
  auto r = raw("cudaMalloc", {0x7ffd000, 1 << 20});
  r.out_value = 0x7f0000000000;
  r.flags |= GS_CALL_OUT_OK;
  EXPECT_EQ(decoded(r).ptr, 0x7f0000000000u);
  EXPECT_EQ(decoded(r).bytes, 1u << 20);
  r.ret = 2;  // cudaErrorMemoryAllocation: whatever *devPtr holds is not an allocation
  EXPECT_EQ(decoded(r).ptr, 0u);
}

TEST(Decode, ReturnCodeIsThe32BitErrorEvenWithGarbageAbove) {
  auto e = decoded(raw("cudaFree", {0x1}, 0, 5, int64_t(0xdead000000000023)));
  EXPECT_EQ(e.ret, 35);
}

TEST(Decode, Memcpy2DDriverDescriptor) {
  auto r = raw("cuMemcpy2D_v2", {0x1000});
  uint32_t host = 1, device = 2;
  uint64_t src_host = 0x5000, dst_dev = 0x7000, width = 100, height = 3;
  std::memcpy(r.deref + 16, &host, 4);
  std::memcpy(r.deref + 24, &src_host, 8);
  std::memcpy(r.deref + 72, &device, 4);
  std::memcpy(r.deref + 88, &dst_dev, 8);
  std::memcpy(r.deref + 112, &width, 8);
  std::memcpy(r.deref + 120, &height, 8);
  r.flags |= GS_CALL_DEREF_OK;
  auto e = decoded(r);
  EXPECT_EQ(e.dir, CopyDir::HostToDevice);
  EXPECT_EQ(e.src, 0x5000u);
  EXPECT_EQ(e.ptr, 0x7000u);
  EXPECT_EQ(e.bytes, 300u);
}

TEST(Decode, UnknownFunctionIsRejected) {
  gs_call_record r{};
  r.func = 0xffff;
  CallEvent e;
  EXPECT_FALSE(decode_call(r, e));
}

TEST(Functions, CookiesCarryDerefSpecs) {
  const auto* lookup = function_by_symbol("cuModuleGetFunction");
  const uint64_t c = probe_cookie(*lookup);
  EXPECT_EQ(GS_COOKIE_FUNC(c), lookup->id);
  EXPECT_EQ(GS_COOKIE_ENTRY_ARG(c), 3u);  // the name, third argument
  EXPECT_EQ(GS_COOKIE_ENTRY_STR(c), 1u);
  EXPECT_EQ(GS_COOKIE_RET_ARG(c), 1u);    // the CUfunction out-pointer
  const auto* launch = function_by_symbol("cudaLaunchKernel");
  EXPECT_EQ(GS_COOKIE_FUNC(probe_cookie(*launch)), launch->id);
  EXPECT_EQ(GS_COOKIE_RT_LAUNCH(probe_cookie(*launch)), 1u);
  EXPECT_EQ(GS_COOKIE_DRV_LAUNCH(probe_cookie(*function_by_symbol("cuLaunchKernel"))), 1u);
  std::set<uint16_t> ids;
  for (const auto& f : all_functions()) EXPECT_TRUE(ids.insert(f.id).second) << f.symbol;
}

class TrackerTest : public ::testing::Test {
 protected:
  std::vector<CallEvent> out;
  std::function<void(CallEvent&)> emit = [this](CallEvent& e) { out.push_back(e); };

  CallEvent alloc(std::string_view fn, uint64_t ptr, uint64_t size, uint64_t ts) {
    auto r = raw(fn, {0, size}, ts);
    r.out_value = ptr;
    r.flags |= GS_CALL_OUT_OK;
    return decoded(r);
  }
};

TEST_F(TrackerTest, ResolvesCopyDefaultAndPinnedHostMemory) {
  Tracker t(true);
  t.process(alloc("cudaMalloc", 0x700000000000, 1 << 20, 1), emit);
  t.process(alloc("cudaMallocHost", 0x500000, 4096, 2), emit);
  t.process(decoded(raw("cudaMemcpy", {0x700000000100, 0x500010, 64, 4}, 3)), emit);   // default: pinned -> device
  t.process(decoded(raw("cudaMemcpy", {0x900000, 0x700000000000, 64, 4}, 4)), emit);   // default: device -> pageable
  t.process(decoded(raw("cudaMemcpy", {0x500000, 0x500100, 64, 4}, 5)), emit);         // host -> host
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[2].dir, CopyDir::HostToDevice);
  EXPECT_EQ(out[2].host_mem, HostMem::Pinned);
  EXPECT_EQ(out[3].dir, CopyDir::DeviceToHost);
  EXPECT_EQ(out[3].host_mem, HostMem::Pageable);
  EXPECT_EQ(out[4].dir, CopyDir::HostToHost);
}

TEST_F(TrackerTest, FreedMemoryIsNoLongerPinnedAndLateAttachIsUnknown) {
  Tracker t(false);
  t.process(alloc("cudaHostAlloc", 0x500000, 4096, 1), emit);
  t.process(decoded(raw("cudaFreeHost", {0x500000}, 2)), emit);
  t.process(decoded(raw("cudaMemcpy", {0x700000000000, 0x500000, 64, 1}, 3)), emit);
  EXPECT_EQ(out.back().host_mem, HostMem::Unknown);
}

TEST_F(TrackerTest, HostRegisterMakesMemoryPinned) {
  Tracker t(true);
  t.process(decoded(raw("cudaHostRegister", {0x800000, 1 << 20, 0}, 1)), emit);
  t.process(decoded(raw("cudaMemcpyAsync", {0x700000000000, 0x800000 + 4096, 64, 1, 0}, 2)), emit);
  EXPECT_EQ(out.back().host_mem, HostMem::Pinned);
}

TEST_F(TrackerTest, DriverLaunchNestsUnderRuntimeLaunchAndInheritsItsName) {
  Tracker t(true);
  auto reg = raw("__cudaRegisterFunction", {0, 0x401000, 0, 0}, 1);
  std::strcpy(reinterpret_cast<char*>(reg.deref), "_Z6kernelv");
  reg.flags |= GS_CALL_DEREF_OK;
  t.process(decoded(reg), emit);
  auto rt = raw("cudaLaunchKernel", {0x401000, pack(1, 1), 1, pack(1, 1), 1, 0, 0, 0}, 10);
  CallEvent rt_event = decoded(rt);
  rt_event.stack_id = 5;
  t.process(rt_event, emit);
  // The BPF side skipped the walk (no stack): it is the runtime launch's stack.
  t.process(decoded(raw("cuLaunchKernel", {0xf00, 1, 1, 1, 1, 1, 1, 0, 0}, 11)), emit);
  // A later driver launch with no runtime launch around it stands alone.
  t.process(decoded(raw("cuLaunchKernel", {0xf00, 1, 1, 1, 1, 1, 1, 0, 0}, 20)), emit);
  t.flush(emit);
  // One launch, one row: the driver launch folds into the runtime launch that made it.
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(t.kernel_name(out[1]), "_Z6kernelv");
  EXPECT_EQ(out[1].driver_func, function_by_symbol("cuLaunchKernel")->id);
  EXPECT_EQ(out[1].driver_handle, 0xf00u);
  EXPECT_EQ(out[1].stack_id, 5);
  EXPECT_EQ(out[2].parent_id, 0);
  EXPECT_EQ(t.kernel_name(out[2]), "_Z6kernelv");  // learnt from the runtime launch
}

TEST_F(TrackerTest, AnotherProcessExitingLeavesARuntimeLaunchWaitingForItsDriverLaunch) {
  // An exit record of another process (a shell loop's /bin/true) between a runtime launch's record
  // and its driver launch's: the launch is still one row. Flushing every thread at any exit made
  // it two, the driver launch counted again (2-5 launches too many in 1,007 on the H100).
  Tracker t(true);
  t.process(decoded(raw("cudaLaunchKernel", {0x401000, pack(1, 1), 1, pack(1, 1), 1, 0, 0, 0}, 10)), emit);
  t.flush_process(99, emit);
  t.forget_process(99);
  EXPECT_TRUE(out.empty());
  t.process(decoded(raw("cuLaunchKernel", {0xf00, 1, 1, 1, 1, 1, 1, 0, 0}, 11)), emit);
  // A driver copy inside a runtime copy not returned yet stays held too, to become its child.
  auto drv = raw("cuMemcpyHtoD_v2", {0x700000000000, 0x500000, 64}, 21, 5);
  t.process(decoded(drv), emit);
  t.flush_process(99, emit);
  t.process(decoded(raw("cudaMemcpy", {0x700000000000, 0x500000, 64, 1}, 20, 10)), emit);
  // The process's own exit hands on what it holds.
  t.process(decoded(raw("cudaLaunchKernel", {0x401000, pack(1, 1), 1, pack(1, 1), 1, 0, 0, 0}, 30)), emit);
  t.flush_process(42, emit);
  t.forget_process(42);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].func, function_by_symbol("cudaLaunchKernel")->id);
  EXPECT_EQ(out[0].driver_func, function_by_symbol("cuLaunchKernel")->id);
  EXPECT_EQ(out[1].func, function_by_symbol("cuMemcpyHtoD_v2")->id);
  EXPECT_EQ(out[1].parent_id, out[2].call_id);
  EXPECT_EQ(out[3].func, function_by_symbol("cudaLaunchKernel")->id);
  EXPECT_EQ(std::count_if(out.begin(), out.end(), [](const CallEvent& e) { return !e.parent_id; }), 3);
}

TEST_F(TrackerTest, DriverCallsInsideARuntimeLaunchLeaveItWaitingForItsDriverLaunch) {
  // libcudart asks the driver for the function of a kernel it loaded through a library
  // (cuKernelGetFunction, whose record comes at the launch after it) before launching it.
  Tracker t(true);
  auto lib = raw("cuLibraryGetKernel", {0x100, 0x200, 0x300}, 1);
  std::strcpy(reinterpret_cast<char*>(lib.deref), "kernel_c");
  lib.flags |= GS_CALL_DEREF_OK | GS_CALL_OUT_OK;
  lib.out_value = 0xc00;
  t.process(decoded(lib), emit);
  t.process(decoded(raw("cudaLaunchKernel", {0x401000, pack(1, 1), 1, pack(1, 1), 1, 0, 0, 0}, 10)), emit);
  auto get = raw("cuKernelGetFunction", {0x7fff0000, 0xc00}, 11);
  get.flags |= GS_CALL_OUT_LATER | GS_CALL_OUT_OK;
  get.out_value = 0xf0c;
  t.process(decoded(get), emit);
  t.process(decoded(raw("cuLaunchKernel", {0xf0c, 1, 1, 1, 1, 1, 1, 0, 0}, 12)), emit);
  t.flush(emit);
  ASSERT_EQ(out.size(), 3u);  // the library lookup, the function lookup, one launch
  auto launch = std::find_if(out.begin(), out.end(), [](const CallEvent& e) { return e.driver_func != 0; });
  ASSERT_NE(launch, out.end());
  EXPECT_EQ(launch->func, function_by_symbol("cudaLaunchKernel")->id);
  EXPECT_EQ(launch->driver_func, function_by_symbol("cuLaunchKernel")->id);
  EXPECT_EQ(t.kernel_name(*launch), "kernel_c");  // taught by the driver's handle
}

TEST_F(TrackerTest, UnreadRegistrationNamesAreKeptAsAddressesAndTaughtToTheDriver) {
  // The agent reads a long registration name only at the kernel's first launch: the Tracker
  // keeps where it is, for runtime launches and (once tied) the driver launches they make.
  Tracker t(true);
  CallEvent reg = decoded(raw("__cudaRegisterFunction", {0, 0x401000, 0x7000, 0}, 1));
  reg.name.clear();
  reg.name_addr = 0x7000;
  t.process(reg, emit);
  t.process(decoded(raw("cudaLaunchKernel", {0x401000, pack(1, 1), 1, pack(1, 1), 1, 0, 0, 0}, 10)), emit);
  t.process(decoded(raw("cuLaunchKernel", {0xf00, 1, 1, 1, 1, 1, 1, 0, 0}, 11)), emit);
  t.process(decoded(raw("cuLaunchKernel", {0xf00, 1, 1, 1, 1, 1, 1, 0, 0}, 20)), emit);
  t.flush(emit);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(t.kernel_name(out[1]), "");
  EXPECT_EQ(t.kernel_name_addr(out[1]), 0x7000u);
  EXPECT_EQ(t.kernel_name_addr(out[2]), 0x7000u);  // the driver handle learnt it
  // A name that was read is the name; no address is offered then.
  auto named = raw("__cudaRegisterFunction", {0, 0x402000, 0, 0}, 30);
  std::strcpy(reinterpret_cast<char*>(named.deref), "_Z1kv");
  named.flags |= GS_CALL_DEREF_OK;
  t.process(decoded(named), emit);
  t.process(decoded(raw("cudaLaunchKernel", {0x402000, pack(1, 1), 1, pack(1, 1), 1, 0, 0, 0}, 31)), emit);
  t.flush(emit);
  EXPECT_EQ(t.kernel_name(out.back()), "_Z1kv");
  EXPECT_EQ(t.kernel_name_addr(out.back()), 0u);
}

TEST_F(TrackerTest, DriverCallsInsideARuntimeCallAreItsChildren) {
  Tracker t(true);
  // cudaMalloc [100, 200] calls cuMemAlloc_v2 [120, 150]; the return of the inner call comes first.
  t.process(alloc("cuMemAlloc_v2", 0x700000000000, 64, 120), emit);
  EXPECT_TRUE(out.empty());  // held until the enclosing call is known
  auto outer = raw("cudaMalloc", {0, 64}, 100, 100);
  t.process(decoded(outer), emit);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].func, function_by_symbol("cuMemAlloc_v2")->id);
  EXPECT_EQ(out[0].parent_id, out[1].call_id);
  EXPECT_EQ(out[0].stack_id, 0);  // neither had a stack
  // A driver call that no runtime call encloses is handed on by flush, top-level.
  t.process(alloc("cuMemAlloc_v2", 0x700000100000, 64, 500), emit);
  t.flush(emit);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].parent_id, 0);
}

TEST_F(TrackerTest, DriverCallsInsideARuntimeCallTakeItsStack) {
  // The BPF side takes no stack for a driver call made inside a runtime call: the child row
  // gets its parent's; one with a stack of its own keeps it.
  Tracker t(true);
  auto inner = alloc("cuMemAlloc_v2", 0x700000000000, 64, 120);
  t.process(inner, emit);
  auto outer = decoded(raw("cudaMalloc", {0, 64}, 100, 100));
  outer.stack_id = 42;
  t.process(outer, emit);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].parent_id, out[1].call_id);
  EXPECT_EQ(out[0].stack_id, 42);
  auto own = alloc("cuMemAlloc_v2", 0x700000100000, 64, 320);
  own.stack_id = 7;
  t.process(own, emit);
  auto outer2 = decoded(raw("cudaMalloc", {0, 64}, 300, 100));
  outer2.stack_id = 43;
  t.process(outer2, emit);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2].stack_id, 7);
}

TEST_F(TrackerTest, RuntimeFunctionsThatOnlyWrapTheDriverAreFoundOnce) {
  Tracker t(true);
  const uint16_t memset_id = function_by_symbol("cudaMemsetAsync")->id;
  auto memset_pair = [&](uint64_t ts, bool with_driver) {
    if (with_driver) t.process(decoded(raw("cuMemsetD8Async", {0x7000, 7, 4096, 0}, ts + 2, 5)), emit);
    t.process(decoded(raw("cudaMemsetAsync", {0x7000, 7, 4096, 0}, ts, 10)), emit);
  };
  for (uint64_t i = 0; i + 1 < Tracker::kRedundantAfter; ++i) memset_pair(100 * i, true);
  EXPECT_TRUE(t.take_redundant_runtime_functions().empty());
  memset_pair(100 * Tracker::kRedundantAfter, true);
  EXPECT_EQ(t.take_redundant_runtime_functions(), std::vector<uint16_t>{memset_id});
  memset_pair(100 * (Tracker::kRedundantAfter + 1), true);
  EXPECT_TRUE(t.take_redundant_runtime_functions().empty());  // said once

  // A runtime call alone while the driver's probes were not all in place yet weighs nothing: before
  // gpuscope says when they were (a driver library being attached to a running process: one of its
  // copy functions probed, another not yet), and before that time once it has.
  Tracker v(true);
  v.process(decoded(raw("cuMemsetD8Async", {0x7000, 7, 4096, 0}, 2, 5)), emit);
  v.process(decoded(raw("cudaMemsetAsync", {0x7000, 7, 4096, 0}, 10, 10)), emit);
  v.note_driver_probed(42, 50);
  v.process(decoded(raw("cudaMemsetAsync", {0x7000, 7, 4096, 0}, 40, 10)), emit);
  for (uint64_t i = 1; i <= Tracker::kRedundantAfter; ++i) {
    v.process(decoded(raw("cuMemsetD8Async", {0x7000, 7, 4096, 0}, 100 * i + 2, 5)), emit);
    v.process(decoded(raw("cudaMemsetAsync", {0x7000, 7, 4096, 0}, 100 * i, 10)), emit);
  }
  EXPECT_EQ(v.take_redundant_runtime_functions(), std::vector<uint16_t>{memset_id});

  // One call without its driver call once the driver was probed (refused by the runtime, or a
  // driver function gpuscope does not probe) and the function keeps its probes, whatever
  // follows; a driver call of another kind is not one.
  Tracker u(true);
  u.note_driver_probed(42, 0);
  u.process(decoded(raw("cuMemsetD8Async", {0x7000, 7, 4096, 0}, 0, 1)), emit);
  u.process(decoded(raw("cuMemAlloc_v2", {0, 64}, 3, 5)), emit);
  u.process(decoded(raw("cudaMemsetAsync", {0x7000, 7, 4096, 0}, 1, 10)), emit);
  for (uint64_t i = 1; i < 4 * Tracker::kRedundantAfter; ++i) {
    u.process(decoded(raw("cuMemsetD8Async", {0x7000, 7, 4096, 0}, 100 * i + 2, 5)), emit);
    u.process(decoded(raw("cudaMemsetAsync", {0x7000, 7, 4096, 0}, 100 * i, 10)), emit);
  }
  EXPECT_TRUE(u.take_redundant_runtime_functions().empty());
  // Launches are never among them (the runtime names kernels loaded before gpuscope came).
  EXPECT_FALSE(may_be_recorded_by_driver(*function_by_symbol("cudaLaunchKernel")));
  EXPECT_TRUE(may_be_recorded_by_driver(*function_by_symbol("cudaMemcpyAsync")));
  EXPECT_FALSE(may_be_recorded_by_driver(*function_by_symbol("cuMemcpyAsync")));
  EXPECT_FALSE(may_be_recorded_by_driver(*function_by_symbol("cudaMalloc")));  // its caller says whose
}

TEST_F(TrackerTest, DriverLookupsNameCuFunctions) {
  Tracker t(true);
  auto lib = raw("cuLibraryGetKernel", {0x100, 0x200, 0x300}, 1);
  std::strcpy(reinterpret_cast<char*>(lib.deref), "triton_kernel");
  lib.flags |= GS_CALL_DEREF_OK | GS_CALL_OUT_OK;
  lib.out_value = 0xcafe;  // CUkernel
  t.process(decoded(lib), emit);
  auto get = raw("cuKernelGetFunction", {0x100, 0xcafe}, 2);
  get.flags |= GS_CALL_OUT_OK;
  get.out_value = 0xbeef;  // CUfunction
  t.process(decoded(get), emit);
  const auto launch = decoded(raw("cuLaunchKernel", {0xbeef, 1, 1, 1, 1, 1, 1, 0, 0}, 3));
  t.process(launch, emit);
  t.flush(emit);
  EXPECT_EQ(t.kernel_name(launch), "triton_kernel");
}

TEST_F(TrackerTest, LookupsReadAtTheNextLaunchNameOnlyFunctionsNotNamedYet) {
  // cuKernelGetFunction has no return probe: its handle is read at the thread's next launch,
  // without knowing whether it succeeded. A failed lookup leaves what the variable held, maybe
  // another kernel's function: such a handle must not rename it.
  const auto* get_function = function_by_symbol("cuKernelGetFunction");
  EXPECT_FALSE(get_function->has_return);
  EXPECT_EQ(GS_COOKIE_OUT_LATER(probe_cookie(*get_function)), 1u);
  EXPECT_EQ(GS_COOKIE_RET_ARG(probe_cookie(*get_function)), 1u);
  EXPECT_EQ(GS_COOKIE_OUT_LATER(probe_cookie(*function_by_symbol("cuModuleGetFunction"))), 0u);

  Tracker t(true);
  for (auto [kernel, name, ts] : {std::tuple{0xca0ull, "kernel_a", 1ull}, {0xcb0ull, "kernel_b", 2ull}}) {
    auto lib = raw("cuLibraryGetKernel", {0x100, 0x200, 0x300}, ts);
    std::strcpy(reinterpret_cast<char*>(lib.deref), name);
    lib.flags |= GS_CALL_DEREF_OK | GS_CALL_OUT_OK;
    lib.out_value = kernel;
    t.process(decoded(lib), emit);
  }
  auto later = [&](uint64_t kernel, uint64_t function, uint64_t ts) {
    auto get = raw("cuKernelGetFunction", {0x7fff0000, kernel}, ts);
    get.flags |= GS_CALL_OUT_LATER | GS_CALL_OUT_OK;
    get.out_value = function;
    t.process(decoded(get), emit);
    t.process(decoded(raw("cuLaunchKernel", {function, 1, 1, 1, 1, 1, 1, 0, 0}, ts + 1)), emit);
    return t.kernel_name(out.back());
  };
  EXPECT_EQ(later(0xca0, 0xf0a, 10), "kernel_a");
  EXPECT_EQ(later(0xcb0, 0xf0a, 20), "kernel_a");  // kernel_b's lookup failed: 0xf0a stays kernel_a
  EXPECT_EQ(later(0xcb0, 0xf0b, 30), "kernel_b");
}


TEST(Decode, NcclCollectivesReadTheirStreamFromTheStack) {
  // ncclAllReduce(send, recv, count, datatype, op, comm, stream): the stream is the 7th argument.
  auto e = decoded(raw("ncclAllReduce", {0x1000, 0x2000, 1024, 9 /* bfloat16 */, 4 /* avg */, 0xc0, 0x30}));
  ASSERT_TRUE(e.nccl);
  EXPECT_EQ(e.nccl->comm, 0xc0u);
  EXPECT_EQ(e.nccl->count, 1024u);
  EXPECT_EQ(nccl_datatype_name(e.nccl->datatype), "bfloat16");
  EXPECT_EQ(nccl_op_name(e.nccl->op), "avg");
  EXPECT_EQ(e.bytes, 2048u);
  EXPECT_EQ(e.stream, 0x30u);
  EXPECT_EQ(e.src, 0x1000u);
  EXPECT_EQ(e.ptr, 0x2000u);
  // ncclReduce(send, recv, count, datatype, op, root, comm, stream): comm and stream both on the stack.
  auto r = decoded(raw("ncclReduce", {0x1000, 0x2000, 8, 12 /* past the known types */, 7, 2, 0xc0, 0x30}));
  EXPECT_EQ(r.nccl->peer, 2);
  EXPECT_EQ(nccl_op_name(r.nccl->op), "custom");  // made by ncclRedOpCreate*
  EXPECT_FALSE(r.bytes_known);
  EXPECT_EQ(r.stream, 0x30u);
  // ncclSend(buf, count, datatype, peer, comm, stream).
  auto s = decoded(raw("ncclSend", {0x1000, 100, 2 /* int32 */, 3, 0xc0, 0x30}));
  EXPECT_EQ(s.bytes, 400u);
  EXPECT_EQ(s.nccl->peer, 3);
  EXPECT_EQ(s.nccl->comm, 0xc0u);
}

TEST(Decode, NcclCommunicatorsCarryTheIdEveryRankWasGiven) {
  // ncclCommInitRank(comm* out, nranks, [ncclUniqueId by value], rank): nranks and rank in
  // registers, the id's first words where the stack arguments are read.
  auto r = raw("ncclCommInitRank", {0x7ff0, 8, 3, 0, 0, 0, 0x1111, 0x2222, 0x3333, 0x4444});
  r.flags |= GS_CALL_OUT_OK;
  r.out_value = 0xc0;
  auto a = decoded(r);
  ASSERT_TRUE(a.nccl);
  EXPECT_EQ(a.nccl->nranks, 8);
  EXPECT_EQ(a.nccl->rank, 3);
  EXPECT_EQ(a.nccl->comm, 0xc0u);
  // Another rank of the same communicator: the same identity; another id: another.
  auto other = raw("ncclCommInitRankConfig", {0x7ff0, 8, 5, 0xcf, 0, 0, 0x1111, 0x2222, 0x3333, 0x4444});
  other.ret = 7;  // ncclInProgress: a communicator made without blocking, written already
  other.flags |= GS_CALL_OUT_OK;
  other.out_value = 0xd0;
  auto b = decoded(other);
  EXPECT_EQ(b.nccl->id_hash, a.nccl->id_hash);
  EXPECT_EQ(b.nccl->comm, 0xd0u);
  EXPECT_NE(decoded(raw("ncclCommInitRank", {0x7ff0, 8, 3, 0, 0, 0, 0x1112, 0x2222, 0x3333, 0x4444})).nccl->id_hash,
            a.nccl->id_hash);
}

TEST(Tracker, NcclCallsInAGroupBelongToItsOutermostStart) {
  Tracker t(true);
  std::vector<CallEvent> out;
  auto emit = [&](CallEvent& e) { out.push_back(e); };
  uint64_t ts = 1000;
  auto call = [&](std::string_view name, std::initializer_list<uint64_t> args = {}) {
    t.process(decoded(raw(name, args, ts += 100)), emit);
  };
  call("ncclAllReduce", {0, 0, 1, 7, 0, 0xc0, 0});
  call("ncclGroupStart");
  call("ncclGroupStart");  // nested: still the outer group
  call("ncclSend", {0, 1, 7, 1, 0xc0, 0});
  call("ncclGroupEnd");
  call("ncclRecv", {0, 1, 7, 1, 0xc0, 0});
  call("ncclGroupEnd");
  call("ncclBroadcast", {0, 0, 1, 7, 0, 0xc0, 0});
  ASSERT_EQ(out.size(), 8u);
  const int64_t start = out[1].call_id;
  std::vector<int64_t> groups;
  for (const auto& e : out) groups.push_back(e.nccl ? e.nccl->group : -1);
  EXPECT_EQ(groups, (std::vector<int64_t>{0, start, start, start, start, start, start, 0}));
}
