// The copy family past 1-D and 2-D copies: decoding its records (3-D descriptors in long records,
// array, symbol, peer and batch copies) and what the tracker adds (array element sizes, the
// driver copy inside a runtime one).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "decode/copies.h"
#include "decode/decoder.h"
#include "decode/tracker.h"

using namespace gpuscope;
using namespace gpuscope::decode;
using namespace gpuscope::cuda;

namespace {

gs_call_record raw(std::string_view symbol, std::initializer_list<uint64_t> args, uint64_t ts = 1000,
                   uint64_t dur = 10, int64_t ret = 0) {
  gs_call_record r{};
  const FunctionSpec* f = function_by_symbol(symbol);
  EXPECT_NE(f, nullptr) << symbol;
  r.kind = GS_REC_CALL;
  r.func = f ? f->id : 0;
  r.flags = GS_CALL_HAS_RETURN;
  r.ts_ns = ts;
  r.duration_ns = dur;
  r.pid = 42;
  r.tid = 7;
  r.ret = ret;
  size_t i = 0;
  for (uint64_t a : args) r.args[i++] = a;
  return r;
}

// A call's entry data as BPF sends it: the first GS_DEREF_LEN bytes in the record, the rest of a
// long one after it.
struct Entry {
  gs_call_record r;
  std::vector<uint8_t> more;

  template <typename T>
  void put(size_t offset, T v) {
    if (offset + sizeof(T) > GS_DEREF_LEN) more.resize(GS_DEREF_LONG_LEN - GS_DEREF_LEN);
    auto* p = reinterpret_cast<const uint8_t*>(&v);
    for (size_t i = 0; i < sizeof(T); ++i) {
      const size_t o = offset + i;
      (o < GS_DEREF_LEN ? r.deref[o] : more[o - GS_DEREF_LEN]) = p[i];
    }
    r.flags |= GS_CALL_DEREF_OK;
  }
  CallEvent decoded() const {
    CallEvent e;
    EXPECT_TRUE(decode_call(r, e, more));
    return e;
  }
};

Entry entry(std::string_view symbol, std::initializer_list<uint64_t> args, uint64_t ts = 1000, uint64_t dur = 10) {
  return Entry{raw(symbol, args, ts, dur), {}};
}

CallEvent decoded(const gs_call_record& r) {
  CallEvent e;
  EXPECT_TRUE(decode_call(r, e));
  return e;
}

// cudaMemcpy3DParms: arrays at 0 and 64, pitched pointers at 32 and 96, extent at 128, kind at 152.
Entry runtime_3d(std::string_view fn, uint64_t src_array, uint64_t src_ptr, uint64_t dst_array, uint64_t dst_ptr,
                 uint64_t w, uint64_t h, uint64_t d, uint32_t kind, uint64_t ts = 1000, uint64_t dur = 10) {
  Entry e = entry(fn, {0x7ffd0000, 0x5}, ts, dur);
  e.put<uint64_t>(0, src_array);
  e.put<uint64_t>(32, src_ptr);
  e.put<uint64_t>(64, dst_array);
  e.put<uint64_t>(96, dst_ptr);
  e.put<uint64_t>(128, w);
  e.put<uint64_t>(136, h);
  e.put<uint64_t>(144, d);
  e.put<uint32_t>(152, kind);
  return e;
}

// CUDA_MEMCPY3D: memory types at 32 and 120 (host pointer +8, device +16, array +24), extent at 176.
Entry driver_3d(std::string_view fn, uint32_t src_type, uint64_t src, uint32_t dst_type, uint64_t dst, uint64_t w,
                uint64_t h, uint64_t d, uint64_t ts = 1000, uint64_t dur = 10) {
  Entry e = entry(fn, {0x7ffd0000, 0x9}, ts, dur);
  auto side = [&](size_t at, uint32_t type, uint64_t ptr) {
    e.put<uint32_t>(at, type);
    e.put<uint64_t>(at + (type == 1 ? 8 : type == 3 ? 24 : 16), ptr);
  };
  side(32, src_type, src);
  side(120, dst_type, dst);
  e.put<uint64_t>(176, w);
  e.put<uint64_t>(184, h);
  e.put<uint64_t>(192, d);
  return e;
}

class CopyTracker : public ::testing::Test {
 protected:
  Tracker t{true};
  std::vector<CallEvent> out;
  std::function<void(CallEvent&)> emit = [this](CallEvent& e) { out.push_back(e); };

  // cudaMalloc3DArray(out, desc, cudaExtent on the stack, flags): a float array of w x h x d.
  void make_float_array(uint64_t handle, uint64_t ts) {
    auto r = raw("cudaMalloc3DArray", {0x7ffd0000, 0x7ffd0100, 0, 0, 0, 0, 16, 8, 4}, ts);
    int32_t desc[5] = {32, 0, 0, 0, 2};  // cudaChannelFormatKindFloat
    std::memcpy(r.deref, desc, sizeof(desc));
    r.flags |= GS_CALL_DEREF_OK | GS_CALL_OUT_OK;
    r.out_value = handle;
    t.process(decoded(r), emit);
  }
};

}  // namespace

TEST(CopyDecode, Driver3DDescriptorComesInALongRecord) {
  const auto* f = function_by_symbol("cuMemcpy3D_v2");
  EXPECT_GT(f->entry_deref_len, GS_DEREF_LEN);  // 200 bytes: CUDA_MEMCPY3D whole
  EXPECT_EQ(GS_COOKIE_ENTRY_LEN(probe_cookie(*f)), 200u);
  EXPECT_EQ(GS_COOKIE_ENTRY_ARG(probe_cookie(*f)), 1u);
  // Host to array: the array's handle is the destination; the extent is in bytes.
  auto e = driver_3d("cuMemcpy3D_v2", 1, 0x5000, 3, 0xa770, 700, 4, 3).decoded();
  EXPECT_EQ(e.src, 0x5000u);
  EXPECT_EQ(e.ptr, 0xa770u);
  EXPECT_EQ(e.bytes, 8400u);
  EXPECT_TRUE(e.bytes_known);
  EXPECT_EQ(e.dir, CopyDir::HostToDevice);
  EXPECT_EQ(e.device_sides, CallEvent::kDstOnDevice);
  // The same struct's fields cut at GS_DEREF_LEN (a short record): the extent is not there.
  Entry cut = driver_3d("cuMemcpy3DAsync_v2", 2, 0x7000, 1, 0x5000, 900, 2, 2);
  cut.more.clear();
  EXPECT_EQ(cut.decoded().bytes, 0u);
  // Peer copies' descriptor has the same offsets; the stream is the second argument.
  auto peer = driver_3d("cuMemcpy3DPeerAsync", 2, 0x7000, 2, 0x8000, 1700, 1, 1).decoded();
  EXPECT_EQ(peer.bytes, 1700u);
  EXPECT_EQ(peer.dir, CopyDir::DeviceToDevice);
  EXPECT_EQ(peer.stream, 0x9u);
}

TEST(CopyDecode, Driver2DDescriptorNamesTheArrayOfAnArraySide) {
  // CUDA_MEMCPY2D: types at 16 and 72; an array side's handle at +24 (was read as a device pointer).
  Entry e = entry("cuMemcpy2D_v2", {0x7ffd0000});
  e.put<uint32_t>(16, 3);
  e.put<uint64_t>(40, 0xa2d0);
  e.put<uint32_t>(72, 1);
  e.put<uint64_t>(80, 0x5000);
  e.put<uint64_t>(112, 160);
  e.put<uint64_t>(120, 2);
  auto c = e.decoded();
  EXPECT_EQ(c.src, 0xa2d0u);
  EXPECT_EQ(c.ptr, 0x5000u);
  EXPECT_EQ(c.bytes, 320u);
  EXPECT_EQ(c.dir, CopyDir::DeviceToHost);
  EXPECT_NE(function_by_symbol("cuMemcpy2DUnaligned_v2_ptds"), nullptr);
}

TEST(CopyDecode, Runtime3DInBytesOrInAnArraysElements) {
  EXPECT_EQ(function_by_symbol("cudaMemcpy3D")->entry_deref_len, 160u);
  auto bytes = runtime_3d("cudaMemcpy3D", 0, 0x5000, 0, 0x7000, 1000, 3, 2, 1).decoded();
  EXPECT_EQ(bytes.bytes, 6000u);
  EXPECT_EQ(bytes.dir, CopyDir::HostToDevice);
  EXPECT_EQ(bytes.in_elements[0].array, 0u);
  auto elems = runtime_3d("cudaMemcpy3DAsync", 0xa3d0, 0, 0, 0x5000, 64, 32, 4, 2).decoded();
  EXPECT_EQ(elems.bytes, 0u);  // the tracker knows the element size
  EXPECT_EQ(elems.in_elements[0].array, 0xa3d0u);
  EXPECT_EQ(elems.in_elements[0].elems, 64u * 32 * 4);
  EXPECT_EQ(elems.src, 0xa3d0u);
  EXPECT_EQ(elems.dir, CopyDir::DeviceToHost);
  EXPECT_EQ(elems.stream, 0x5u);
  // A kind that puts the array on the host is corrected, as the runtime does.
  EXPECT_EQ(runtime_3d("cudaMemcpy3D", 0, 0x5000, 0xa3d0, 0, 4, 4, 1, 0).decoded().dir, CopyDir::HostToDevice);
  // cudaMemcpyDefault: the array's side is device memory; the other is left to the tracker.
  auto def = runtime_3d("cudaMemcpy3D", 0, 0x5000, 0xa3d0, 0, 4, 4, 1, 4).decoded();
  EXPECT_EQ(def.dir, CopyDir::Default);
  EXPECT_EQ(def.device_sides, CallEvent::kDstOnDevice);
  // Unread: nothing is known.
  auto unread = entry("cudaMemcpy3D", {0x7ffd0000}).decoded();
  EXPECT_FALSE(unread.bytes_known);
  EXPECT_EQ(unread.dir, CopyDir::Unknown);
}

TEST(CopyDecode, Runtime3DPeerParms) {
  // cudaMemcpy3DPeerParms: arrays at 0 and 72, pointers at 32 and 104, extent at 144.
  Entry e = entry("cudaMemcpy3DPeerAsync_ptsz", {0x7ffd0000, 0x3});
  e.put<uint64_t>(32, 0x7000);
  e.put<uint64_t>(104, 0x8000);
  e.put<uint64_t>(144, 4096);
  e.put<uint64_t>(152, 1);
  e.put<uint64_t>(160, 1);
  auto c = e.decoded();
  EXPECT_EQ(c.bytes, 4096u);
  EXPECT_EQ(c.src, 0x7000u);
  EXPECT_EQ(c.ptr, 0x8000u);
  EXPECT_EQ(c.dir, CopyDir::DeviceToDevice);
  EXPECT_EQ(c.stream, 0x3u);
}

TEST(CopyDecode, ArraySymbolAndPeerCopiesTakeTheirArguments) {
  struct Case {
    const char* fn;
    std::initializer_list<uint64_t> args;
    uint64_t ptr, src, bytes, stream;
    CopyDir dir;
  };
  const Case cases[] = {
      // cudaMemcpy2DToArray(dst, wOffset, hOffset, src, spitch, width, height, kind, stream)
      {"cudaMemcpy2DToArrayAsync", {0xa2d0, 16, 1, 0x5000, 4096, 1024, 12, 1, 0x33}, 0xa2d0, 0x5000, 12288, 0x33,
       CopyDir::HostToDevice},
      // cudaMemcpy2DFromArray(dst, dpitch, src, wOffset, hOffset, width, height, kind)
      {"cudaMemcpy2DFromArray", {0x5000, 4096, 0xa2d0, 0, 0, 1600, 7, 2}, 0x5000, 0xa2d0, 11200, 0,
       CopyDir::DeviceToHost},
      // cudaMemcpy2DArrayToArray(dst, wo, ho, src, wo, ho, width, height, kind): the 9th argument on the stack
      {"cudaMemcpy2DArrayToArray_ptds", {0xa2d1, 0, 0, 0xa2d0, 0, 0, 512, 5, 3}, 0xa2d1, 0xa2d0, 2560, 0,
       CopyDir::DeviceToDevice},
      // cudaMemcpyToArray(dst, wOffset, hOffset, src, count, kind, stream); HtoH is corrected
      {"cudaMemcpyToArrayAsync_ptsz", {0xa2d0, 0, 4, 0x5000, 2304, 0, 0x34}, 0xa2d0, 0x5000, 2304, 0x34,
       CopyDir::HostToDevice},
      {"cudaMemcpyFromArray", {0x5000, 0xa2d0, 0, 0, 1792, 2}, 0x5000, 0xa2d0, 1792, 0, CopyDir::DeviceToHost},
      {"cudaMemcpyArrayToArray", {0xa2d1, 0, 0, 0xa2d0, 0, 0, 1280, 3}, 0xa2d1, 0xa2d0, 1280, 0,
       CopyDir::DeviceToDevice},
      // cudaMemcpyToSymbol(symbol, src, count, offset, kind, stream)
      {"cudaMemcpyToSymbolAsync", {0x404000, 0x5000, 768, 64, 1, 0x35}, 0x404000, 0x5000, 768, 0x35,
       CopyDir::HostToDevice},
      // cudaMemcpyFromSymbol(dst, symbol, count, offset, kind=DtoD): a device destination
      {"cudaMemcpyFromSymbol", {0x7000, 0x404000, 896, 0, 3}, 0x7000, 0x404000, 896, 0, CopyDir::DeviceToDevice},
      // cudaMemcpyPeer(dst, dstDevice, src, srcDevice, count), cuMemcpyPeerAsync(..., stream)
      {"cudaMemcpyPeer", {0x8000, 1, 0x7000, 0, 3000}, 0x8000, 0x7000, 3000, 0, CopyDir::DeviceToDevice},
      {"cuMemcpyPeerAsync_ptsz", {0x8000, 0xc1, 0x7000, 0xc0, 2700, 0x36}, 0x8000, 0x7000, 2700, 0x36,
       CopyDir::DeviceToDevice},
      // cuMemcpyHtoA(dstArray, dstOffset, srcHost, bytes), cuMemcpyAtoHAsync(dstHost, srcArray, srcOffset, bytes, stream)
      {"cuMemcpyHtoA_v2", {0xa1d0, 0, 0x5000, 1400}, 0xa1d0, 0x5000, 1400, 0, CopyDir::HostToDevice},
      {"cuMemcpyAtoHAsync_v2_ptsz", {0x5000, 0xa1d0, 0, 1152, 0x37}, 0x5000, 0xa1d0, 1152, 0x37, CopyDir::DeviceToHost},
      {"cuMemcpyDtoA_v2", {0xa1d1, 0, 0x7000, 1048}, 0xa1d1, 0x7000, 1048, 0, CopyDir::DeviceToDevice},
      {"cuMemcpyAtoD_v2_ptds", {0x7000, 0xa1d0, 0, 952}, 0x7000, 0xa1d0, 952, 0, CopyDir::DeviceToDevice},
      // cuMemcpyAtoA(dstArray, dstOffset, srcArray, srcOffset, bytes)
      {"cuMemcpyAtoA_v2", {0xa1d1, 2048, 0xa1d0, 0, 848}, 0xa1d1, 0xa1d0, 848, 0, CopyDir::DeviceToDevice},
  };
  for (const auto& c : cases) {
    auto e = decoded(raw(c.fn, c.args));
    EXPECT_EQ(e.ptr, c.ptr) << c.fn;
    EXPECT_EQ(e.src, c.src) << c.fn;
    EXPECT_EQ(e.bytes, c.bytes) << c.fn;
    EXPECT_EQ(e.stream, c.stream) << c.fn;
    EXPECT_EQ(e.dir, c.dir) << c.fn;
  }
}

TEST(CopyDecode, BatchSizesAreSummedInBpf) {
  const auto* f = function_by_symbol("cudaMemcpyBatchAsync");
  EXPECT_EQ(GS_COOKIE_BATCH(probe_cookie(*f)), 1u);
  EXPECT_EQ(GS_COOKIE_ENTRY_ARG(probe_cookie(*f)), 0u);
  EXPECT_EQ(GS_COOKIE_BATCH3D(probe_cookie(*function_by_symbol("cuMemcpy3DBatchAsync_v2"))), 1u);
  EXPECT_EQ(GS_COOKIE_BATCH(probe_cookie(*function_by_symbol("cudaMemcpyAsync"))), 0u);
  // (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, stream)
  auto r = raw("cudaMemcpyBatchAsync", {0x7ffd0000, 0x7ffd0100, 0x7ffd0200, 3, 0, 0, 1, 0x38});
  gs_batch_entry b{6600, 3, 0x7000, 0x5000};
  std::memcpy(r.deref, &b, sizeof(b));
  r.flags |= GS_CALL_DEREF_OK;
  auto e = decoded(r);
  EXPECT_EQ(e.bytes, 6600u);
  EXPECT_EQ(e.copies, 3u);
  EXPECT_TRUE(e.bytes_known);
  EXPECT_EQ(e.ptr, 0x7000u);
  EXPECT_EQ(e.src, 0x5000u);
  EXPECT_EQ(e.dir, CopyDir::Default);
  EXPECT_EQ(e.stream, 0x38u);
  // CUDA 12.8's form: failIdx before the stream.
  auto old = raw("cuMemcpyBatchAsync", {0x7ffd0000, 0x7ffd0100, 0x7ffd0200, 3, 0, 0, 1, 0x7ffd0300, 0x39});
  std::memcpy(old.deref, &b, sizeof(b));
  old.flags |= GS_CALL_DEREF_OK;
  EXPECT_EQ(decoded(old).stream, 0x39u);
  // Fewer sizes read than copies: the total is not known.
  b.summed = 2;
  std::memcpy(r.deref, &b, sizeof(b));
  EXPECT_FALSE(decoded(r).bytes_known);
}

TEST(CopyDecode, ElementSizesOfArrayFormats) {
  EXPECT_EQ(channel_desc_element_size(32, 32, 32, 32, 2), 16u);  // float4
  EXPECT_EQ(channel_desc_element_size(8, 8, 0, 0, 1), 2u);       // uchar2
  EXPECT_EQ(channel_desc_element_size(16, 0, 0, 0, 8), 2u);      // 16-bit normalized, 1 channel
  EXPECT_EQ(channel_desc_element_size(10, 10, 10, 2, 31), 4u);   // 10-10-10-2
  EXPECT_EQ(channel_desc_element_size(8, 8, 8, 8, 17), 0u);      // BC1: blocks, not texels
  EXPECT_EQ(channel_desc_element_size(8, 0, 0, 0, 4), 0u);       // NV12
  EXPECT_EQ(array_format_element_size(0x20, 4), 16u);            // FLOAT x 4
  EXPECT_EQ(array_format_element_size(0x10, 2), 4u);             // HALF x 2
  EXPECT_EQ(array_format_element_size(0x01, 4), 4u);             // UNSIGNED_INT8 x 4
  EXPECT_EQ(array_format_element_size(0xc5, 4), 8u);             // UNORM_INT16X4
  EXPECT_EQ(array_format_element_size(0x91, 4), 0u);             // BC1_UNORM
}

TEST_F(CopyTracker, Runtime3DCopyOfAnArrayCountsItsElementsBytes) {
  make_float_array(0xa3d0, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bytes, 16u * 8 * 4 * 4);  // the extent on the stack, 4-byte elements
  EXPECT_EQ(out[0].ptr, 0xa3d0u);
  t.process(runtime_3d("cudaMemcpy3D", 0, 0x5000, 0xa3d0, 0, 8, 4, 2, 1, 10).decoded(), emit);
  EXPECT_EQ(out.back().bytes, 8u * 4 * 2 * 4);
  EXPECT_TRUE(out.back().bytes_known);
  EXPECT_EQ(out.back().dir, CopyDir::HostToDevice);
  EXPECT_EQ(out.back().host_mem, HostMem::Pageable);
  // cudaMemcpyDefault with a device pointer: device to device.
  auto a = raw("cudaMalloc", {0, 1 << 20}, 20);
  a.out_value = 0x700000000000;
  a.flags |= GS_CALL_OUT_OK;
  t.process(decoded(a), emit);
  t.process(runtime_3d("cudaMemcpy3D", 0xa3d0, 0, 0, 0x700000000100, 8, 4, 1, 4, 30).decoded(), emit);
  EXPECT_EQ(out.back().dir, CopyDir::DeviceToDevice);
  EXPECT_EQ(out.back().bytes, 128u);
  // Destroyed: its element size is forgotten with it.
  t.process(decoded(raw("cudaFreeArray", {0xa3d0}, 40)), emit);
  t.process(runtime_3d("cudaMemcpy3D", 0, 0x5000, 0xa3d0, 0, 8, 4, 2, 1, 50).decoded(), emit);
  EXPECT_FALSE(out.back().bytes_known);
}

TEST_F(CopyTracker, AnArrayNotSeenCreatedTakesTheBytesOfTheDriverCopyInside) {
  // cudaMemcpy3D [100, 200] into an array made before the recording, with cuMemcpy3D_v2 [120, 150]
  // inside it, which says the width in bytes.
  t.process(driver_3d("cuMemcpy3D_v2", 1, 0x5000, 3, 0xa3d9, 40, 3, 1, 120, 30).decoded(), emit);
  t.process(runtime_3d("cudaMemcpy3D", 0, 0x5000, 0xa3d9, 0, 5, 3, 1, 1, 100, 100).decoded(), emit);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].parent_id, out[1].call_id);
  EXPECT_EQ(out[1].bytes, 120u);
  EXPECT_TRUE(out[1].bytes_known);
  // Without a driver copy inside (refused by the runtime), it stays unknown.
  t.process(runtime_3d("cudaMemcpy3D", 0, 0x5000, 0xa3d9, 0, 5, 3, 1, 1, 300, 10).decoded(), emit);
  EXPECT_FALSE(out.back().bytes_known);
}

TEST_F(CopyTracker, MipmapLevelsHaveTheirMipmappedArraysElements) {
  // cuMipmappedArrayCreate(out, CUDA_ARRAY3D_DESCRIPTOR*, levels): 2 x UNSIGNED_INT8.
  auto mip = raw("cuMipmappedArrayCreate", {0x7ffd0000, 0x7ffd0100, 3}, 1);
  uint64_t dims[3] = {64, 64, 0};
  uint32_t format[2] = {0x01, 2};
  std::memcpy(mip.deref, dims, sizeof(dims));
  std::memcpy(mip.deref + 24, format, sizeof(format));
  mip.flags |= GS_CALL_DEREF_OK | GS_CALL_OUT_OK;
  mip.out_value = 0xf1f0;
  t.process(decoded(mip), emit);
  EXPECT_TRUE(out.empty());  // a driver call is held until the runtime call around it is known
  auto level = raw("cuMipmappedArrayGetLevel", {0x7ffd0000, 0xf1f0, 1}, 2);
  level.flags |= GS_CALL_OUT_OK;
  level.out_value = 0xf1f1;
  t.process(decoded(level), emit);
  t.process(runtime_3d("cudaMemcpy3D", 0, 0x5000, 0xf1f1, 0, 20, 10, 1, 1, 10).decoded(), emit);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].elem_size, 2u);
  EXPECT_EQ(out[0].bytes, 64u * 64 * 2);
  EXPECT_EQ(out[1].ptr, 0xf1f1u);
  EXPECT_EQ(out[2].bytes, 400u);
}

TEST_F(CopyTracker, ThreeDBatchOperationsCountTheirArraysElements) {
  make_float_array(0xa3d0, 1);
  // Two operations: pointer to pointer (1000 bytes), pointer to the float array (64 elements).
  auto r = raw("cudaMemcpy3DBatchAsync", {2, 0x7ffd0000, 0, 0x3a}, 10);
  gs_batch3d_entry b{};
  b.ops = 2, b.bytes = 1000, b.array[0] = 0xa3d0, b.elems[0] = 64;
  b.src0_type = 1, b.dst0_type = 1, b.src0 = 0x5000, b.dst0 = 0x700000000000;
  std::memcpy(r.deref, &b, sizeof(b));
  r.flags |= GS_CALL_DEREF_OK;
  t.process(decoded(r), emit);
  EXPECT_EQ(out.back().bytes, 1000u + 64 * 4);
  EXPECT_EQ(out.back().copies, 2u);
  EXPECT_EQ(out.back().stream, 0x3au);
  // An array whose creation was not seen, or a third array: not known.
  b.array[1] = 0xbbbb, b.elems[1] = 8;
  std::memcpy(r.deref, &b, sizeof(b));
  t.process(decoded(r), emit);
  EXPECT_FALSE(out.back().bytes_known);
  b.array[1] = 0, b.elems[1] = 0, b.other_ops = 1;
  std::memcpy(r.deref, &b, sizeof(b));
  t.process(decoded(r), emit);
  EXPECT_FALSE(out.back().bytes_known);
}

TEST_F(CopyTracker, SymbolsAndArraysAreDeviceMemoryForCudaMemcpyDefault) {
  // cudaMemcpyFromSymbol(dst, symbol, count, offset, cudaMemcpyDefault): the symbol is on the device.
  t.process(decoded(raw("cudaMemcpyFromSymbol", {0x5000, 0x404000, 896, 0, 4})), emit);
  EXPECT_EQ(out.back().dir, CopyDir::DeviceToHost);
  EXPECT_EQ(out.back().host_mem, HostMem::Pageable);
  t.process(decoded(raw("cudaMemcpyToArray", {0xa2d0, 0, 3, 0x5000, 3072, 4})), emit);
  EXPECT_EQ(out.back().dir, CopyDir::HostToDevice);
}

TEST(CopyFunctions, RuntimeCopiesTheDriverMayRecordFitTheRetiringBitmap) {
  int runtime_copies = 0;
  for (const auto& f : all_functions()) {
    if (may_be_recorded_by_driver(f)) EXPECT_LT(f.id, kRetiringIds) << f.symbol;
    runtime_copies += f.api == Api::Runtime && f.kind == CallKind::Memcpy;
  }
  EXPECT_GE(runtime_copies, 50);
  EXPECT_TRUE(may_be_recorded_by_driver(*function_by_symbol("cudaMemcpy3D")));
  EXPECT_TRUE(may_be_recorded_by_driver(*function_by_symbol("cudaMemcpyBatchAsync_ptsz")));
  EXPECT_FALSE(may_be_recorded_by_driver(*function_by_symbol("cudaMallocArray")));  // not a copy
  EXPECT_FALSE(is_high_rate(*function_by_symbol("cudaMallocArray")));
}
