// Copies whose direction the tracker works out from their pointers (cudaMemcpyDefault, cuMemcpy),
// where a pointer is to memory no probed call made: a symbol's device address. On the H100
// (copy_family, CUDA 13) cudaMemcpyFromSymbol(dst, symbol, 896, 0, cudaMemcpyDefault) made a
// default-direction driver copy from the symbol's device address, which the tracker took for
// pageable host memory: the row said DtoH, the copy inside it HtoH. A copy inside a runtime copy
// takes the runtime copy's side where it could only guess; module globals' lookups make their
// addresses device memory.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "decode/decoder.h"
#include "decode/tracker.h"

using namespace gpuscope;
using namespace gpuscope::decode;
using namespace gpuscope::cuda;

namespace {

constexpr uint64_t kDefault = 4, kDtoH = 2, kHtoD = 1;  // cudaMemcpyKind
constexpr uint64_t kShadow = 0x404000;                  // the symbol's host shadow (&symbol_buf)
constexpr uint64_t kSymbolDev = 0x7f3a00200000;         // its device address: never allocated
constexpr uint64_t kPageable = 0x5000, kDevice = 0x700000000000;

// A call record as the BPF side sends it; under_runtime: made inside a pending runtime call.
gs_call_record raw(std::string_view symbol, std::initializer_list<uint64_t> args, uint64_t ts, uint64_t dur,
                   bool under_runtime = false) {
  gs_call_record r{};
  const FunctionSpec* f = function_by_symbol(symbol);
  EXPECT_NE(f, nullptr) << symbol;
  r.kind = GS_REC_CALL;
  r.func = f ? f->id : 0;
  r.flags = GS_CALL_HAS_RETURN | (under_runtime ? GS_CALL_UNDER_RUNTIME : 0);
  r.ts_ns = ts;
  r.duration_ns = dur;
  r.pid = 42;
  r.tid = 7;
  size_t i = 0;
  for (uint64_t a : args) r.args[i++] = a;
  return r;
}

CallEvent call(std::string_view symbol, std::initializer_list<uint64_t> args, uint64_t ts, uint64_t dur,
               bool under_runtime = false) {
  CallEvent e;
  EXPECT_TRUE(decode_call(raw(symbol, args, ts, dur, under_runtime), e));
  return e;
}

// cuLibraryGetGlobal(&dptr, &bytes, library, name) and the like, as call_return reads them: the
// address as the out-pointer's value, the size as the entry data (GS_COOKIE_OUT_SIZE).
CallEvent global_lookup(std::string_view symbol, uint64_t dptr, uint64_t bytes, uint64_t ts, uint64_t dur,
                        bool under_runtime = false, bool size_read = true) {
  gs_call_record r = raw(symbol, {0x7ffd0000, 0x7ffd0008, 0x1b0000, 0x7ffd0100}, ts, dur, under_runtime);
  r.flags |= GS_CALL_OUT_OK;
  r.out_value = dptr;
  if (size_read) {
    std::memcpy(r.deref, &bytes, sizeof(bytes));
    r.deref_len = sizeof(bytes);
    r.flags |= GS_CALL_DEREF_OK;
  }
  CallEvent e;
  EXPECT_TRUE(decode_call(r, e));
  return e;
}

uint16_t id_of(std::string_view symbol) { return function_by_symbol(symbol)->id; }

class CopySides : public ::testing::Test {
 protected:
  Tracker t{true};
  std::vector<CallEvent> out;
  std::function<void(CallEvent&)> emit = [this](CallEvent& e) { out.push_back(e); };

  const CallEvent& row(std::string_view symbol, size_t nth = 0) {
    for (const auto& e : out)
      if (e.func == id_of(symbol) && nth-- == 0) return e;
    ADD_FAILURE() << "no row " << symbol;
    return out.front();
  }

  // cudaMemcpyFromSymbol(dst, symbol, 896, offset 0, kind) [ts, ts + 100], as libcudart 13 makes
  // it: a driver copy [ts + 40, ts + 70] from the symbol's device address, after its lookup
  // [ts + 10, ts + 30] when `lookup` (libcudart looks a symbol up once, on first use).
  void from_symbol(uint64_t ts, uint64_t kind, std::string_view driver = "cuMemcpy", bool lookup = false,
                   std::string_view runtime = "cudaMemcpyFromSymbol") {
    if (lookup) t.process(global_lookup("cuLibraryGetGlobal", kSymbolDev, 4096, ts + 10, 20, true), emit);
    t.process(call(driver, {kPageable, kSymbolDev, 896}, ts + 40, 30, true), emit);
    t.process(call(runtime, {kPageable, kShadow, 896, 0, kind}, ts, 100), emit);
  }
};

}  // namespace

TEST_F(CopySides, ADefaultDriverCopyInsideASymbolCopyTakesItsDirection) {
  for (const char* suffix : {"", "_ptds"}) {
    out.clear();
    from_symbol(suffix[0] ? 5000 : 100, kDefault, std::string("cuMemcpy") + suffix, false,
                std::string("cudaMemcpyFromSymbol") + suffix);
    ASSERT_EQ(out.size(), 2u) << suffix;
    const CallEvent& outer = out[1];
    const CallEvent& inner = out[0];
    EXPECT_EQ(outer.parent_id, 0);
    EXPECT_EQ(inner.parent_id, outer.call_id);
    EXPECT_EQ(outer.dir, CopyDir::DeviceToHost) << suffix;
    EXPECT_EQ(outer.host_mem, HostMem::Pageable);
    // Its source, the symbol's device address, is in no tracked allocation: without the runtime
    // copy around it, it would be host to host.
    EXPECT_EQ(inner.dir, CopyDir::DeviceToHost) << suffix;
    EXPECT_EQ(inner.host_mem, HostMem::Pageable) << suffix;
    EXPECT_EQ(inner.bytes, 896u);
  }
  // Alone (a program's own cuMemcpy from an address no probed call told of), it stays a guess.
  out.clear();
  t.process(call("cuMemcpy", {kPageable, kSymbolDev, 896}, 9000, 10), emit);
  t.flush(emit);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dir, CopyDir::HostToHost);
}

TEST_F(CopySides, AFixedDirectionDriverCopyKeepsItsOwn) {
  // cudaMemcpyFromSymbol with cudaMemcpyDeviceToHost: libcudart's cuMemcpyDtoH_v2 says so itself.
  from_symbol(100, kDtoH, "cuMemcpyDtoH_v2");
  EXPECT_EQ(row("cuMemcpyDtoH_v2").dir, CopyDir::DeviceToHost);
  // A driver copy whose direction its function fixes is never rewritten, even where it and the
  // runtime copy around it disagree.
  out.clear();
  t.process(call("cuMemcpyDtoD_v2", {kDevice, kSymbolDev, 64}, 1040, 10, true), emit);
  t.process(call("cudaMemcpy", {kDevice, kPageable, 64, kHtoD}, 1000, 100), emit);
  EXPECT_EQ(row("cuMemcpyDtoD_v2").dir, CopyDir::DeviceToDevice);
  EXPECT_EQ(row("cudaMemcpy").dir, CopyDir::HostToDevice);
}

TEST_F(CopySides, ASideTheInnerCopyKnowsStaysItsOwn) {
  // The inner copy's destination is a tracked device allocation; only its source is a guess.
  auto a = raw("cudaMalloc", {0, 1 << 20}, 10, 5);
  a.flags |= GS_CALL_OUT_OK;
  a.out_value = kDevice;
  CallEvent alloc;
  ASSERT_TRUE(decode_call(a, alloc));
  t.process(alloc, emit);
  // cudaMemcpyToSymbol(symbol, src, 640, 0, cudaMemcpyHostToDevice) of a device buffer (the
  // program's mistake): its cuMemcpy's source is in the tracked allocation, device memory, which
  // the runtime copy's kind does not change; its destination, the symbol, it could only guess.
  t.process(call("cuMemcpy", {kSymbolDev, kDevice + 64, 640}, 140, 30, true), emit);
  t.process(call("cudaMemcpyToSymbol", {kShadow, kDevice + 64, 640, 0, kHtoD}, 100, 100), emit);
  EXPECT_EQ(row("cudaMemcpyToSymbol").dir, CopyDir::HostToDevice);
  EXPECT_EQ(row("cuMemcpy").dir, CopyDir::DeviceToDevice);
  EXPECT_EQ(row("cuMemcpy").host_mem, HostMem::NotApplicable);
}

TEST_F(CopySides, ARuntimeCopyLearnsASideOnlyItsOneInnerCopyKnows) {
  // cudaMemcpy(dst, src, n, cudaMemcpyDefault) from an address no probed call told of, made as a
  // cuMemcpyDtoH_v2: the driver knew the source was device memory.
  t.process(call("cuMemcpyDtoH_v2", {kPageable, kSymbolDev, 128}, 120, 10, true), emit);
  t.process(call("cudaMemcpy", {kPageable, kSymbolDev, 128, kDefault}, 100, 100), emit);
  EXPECT_EQ(row("cudaMemcpy").dir, CopyDir::DeviceToHost);
  EXPECT_EQ(row("cudaMemcpy").host_mem, HostMem::Pageable);
}

TEST_F(CopySides, ARuntimeCopyInsideARuntimeCopyIsSettledWithItsOwnCopies) {
  // A runtime that makes its symbol copy through its own cudaMemcpy (cudaMemcpyDefault) of the
  // symbol's device address: the inner runtime copy and its driver copy both guessed host to host
  // when they returned; the symbol copy around them settles both.
  t.process(call("cuMemcpy", {kPageable, kSymbolDev, 896}, 140, 20, true), emit);
  t.process(call("cudaMemcpy", {kPageable, kSymbolDev, 896, kDefault}, 120, 60, true), emit);
  t.process(call("cudaMemcpyFromSymbol", {kPageable, kShadow, 896, 0, kDefault}, 100, 100), emit);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(row("cudaMemcpy").parent_id, row("cudaMemcpyFromSymbol").call_id);
  EXPECT_EQ(row("cuMemcpy").parent_id, row("cudaMemcpy").call_id);
  for (const char* fn : {"cudaMemcpyFromSymbol", "cudaMemcpy", "cuMemcpy"}) {
    EXPECT_EQ(row(fn).dir, CopyDir::DeviceToHost) << fn;
    EXPECT_EQ(row(fn).host_mem, HostMem::Pageable) << fn;
  }
}

TEST_F(CopySides, ModuleGlobalsAreDeviceMemory) {
  EXPECT_EQ(function_by_symbol("cuLibraryGetGlobal")->kind, CallKind::SymbolLookup);
  const uint64_t cookie = probe_cookie(*function_by_symbol("cuModuleGetGlobal_v2"));
  EXPECT_EQ(GS_COOKIE_RET_ARG(cookie), 1u);
  EXPECT_EQ(GS_COOKIE_OUT_SIZE(cookie), 1u);
  EXPECT_EQ(GS_COOKIE_ENTRY_ARG(cookie), 0u);
  EXPECT_EQ(GS_COOKIE_OUT_SIZE(probe_cookie(*function_by_symbol("cuMemAlloc_v2"))), 0u);
  const CallEvent lookup = global_lookup("cuModuleGetGlobal_v2", kSymbolDev, 4096, 10, 5);
  EXPECT_EQ(lookup.ptr, kSymbolDev);
  EXPECT_EQ(lookup.bytes, 4096u);
  EXPECT_TRUE(lookup.bytes_known);
  EXPECT_EQ(lookup.kernel_handle, 0x1b0000u);
  t.process(lookup, emit);
  // A program's own default-direction copies from and into it, anywhere inside it.
  t.process(call("cuMemcpy", {kPageable, kSymbolDev + 1024, 896}, 100, 10), emit);
  t.process(call("cudaMemcpy", {kSymbolDev + 4000, kPageable, 96, kDefault}, 200, 10), emit);
  t.process(call("cuMemcpy", {kPageable, kSymbolDev + 4096, 64}, 300, 10), emit);  // past its end
  t.flush(emit);
  EXPECT_EQ(row("cuMemcpy").dir, CopyDir::DeviceToHost);
  EXPECT_EQ(row("cuMemcpy").host_mem, HostMem::Pageable);
  EXPECT_EQ(row("cudaMemcpy").dir, CopyDir::HostToDevice);
  EXPECT_EQ(row("cuMemcpy", 1).dir, CopyDir::HostToHost);
  // A __managed__ global is managed memory; a lookup that failed, or whose size was not read
  // (a NULL size pointer), tells no range beyond its address.
  t.process(global_lookup("cuLibraryGetManaged", 0x7f3a00400000, 256, 400, 5), emit);
  auto failed = raw("cuLibraryGetGlobal", {0x7ffd0000, 0x7ffd0008, 0x1b0000, 0x7ffd0100}, 500, 5);
  failed.ret = 500;  // CUDA_ERROR_NOT_FOUND
  failed.flags |= GS_CALL_OUT_OK;
  failed.out_value = 0x7f3a00600000;
  CallEvent f;
  ASSERT_TRUE(decode_call(failed, f));
  t.process(f, emit);
  t.process(global_lookup("cuLibraryGetGlobal", 0x7f3a00800000, 0, 600, 5, false, false), emit);
  out.clear();
  t.process(call("cuMemcpy", {kPageable, 0x7f3a00400000 + 8, 8}, 700, 10), emit);
  t.process(call("cuMemcpy", {kPageable, 0x7f3a00600000, 8}, 710, 10), emit);
  t.process(call("cuMemcpy", {kPageable, 0x7f3a00800000, 8}, 720, 10), emit);
  t.process(call("cuMemcpy", {kPageable, 0x7f3a00800000 + 8, 8}, 730, 10), emit);
  t.flush(emit);
  std::vector<CopyDir> dirs;
  for (const auto& e : out)
    if (e.func == id_of("cuMemcpy")) dirs.push_back(e.dir);
  EXPECT_EQ(dirs, (std::vector<CopyDir>{CopyDir::DeviceToHost, CopyDir::HostToHost, CopyDir::DeviceToHost,
                                        CopyDir::HostToHost}));
}

TEST_F(CopySides, ALookupInsideASymbolCopyMakesItsDriverCopyRightByItself) {
  from_symbol(100, kDefault, "cuMemcpy", true);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(row("cuLibraryGetGlobal").parent_id, row("cudaMemcpyFromSymbol").call_id);
  EXPECT_EQ(row("cuMemcpy").dir, CopyDir::DeviceToHost);
  EXPECT_EQ(row("cudaMemcpyFromSymbol").dir, CopyDir::DeviceToHost);
}

TEST_F(CopySides, TheDriverStandsForARuntimeCopyOnlyWhereItTellsTheDirectionItself) {
  // Without the symbol's lookup the driver copy alone would say host to host: the runtime
  // function's probes stay, however many calls.
  t.note_driver_probed(42, 0);
  for (uint64_t i = 0; i < 2 * Tracker::kRedundantAfter; ++i) from_symbol(1000 * (i + 1), kDefault);
  EXPECT_TRUE(t.take_redundant_runtime_functions().empty());
  // With it seen (the runtime's first use of the symbol), the driver copy says device to host
  // by itself: it may stand for the runtime's row.
  Tracker u(true);
  std::swap(t, u);
  t.note_driver_probed(42, 0);
  from_symbol(1000, kDefault, "cuMemcpy", true);
  for (uint64_t i = 1; i < Tracker::kRedundantAfter; ++i) from_symbol(1000 * (i + 1), kDefault);
  EXPECT_EQ(t.take_redundant_runtime_functions(), std::vector<uint16_t>{id_of("cudaMemcpyFromSymbol")});
}
