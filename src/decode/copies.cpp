#include "decode/copies.h"

#include <algorithm>

namespace gpuscope::decode {
namespace {

constexpr uint8_t kSrc = CallEvent::kSrcOnDevice, kDst = CallEvent::kDstOnDevice;

// CUmemorytype: 1 host, 2 device, 3 array, 4 unified (either: the pointer tells).
constexpr uint32_t kHost = 1, kArray = 3;
char mem_side(uint32_t t) { return t == 1 ? 'H' : (t == 2 || t == 3) ? 'D' : '?'; }

cuda::CopyDir dir_from_sides(char src, char dst) {
  if (src == '?' || dst == '?') return cuda::CopyDir::Default;
  if (src == 'H') return dst == 'H' ? cuda::CopyDir::HostToHost : cuda::CopyDir::HostToDevice;
  return dst == 'H' ? cuda::CopyDir::DeviceToHost : cuda::CopyDir::DeviceToDevice;
}

// A descriptor's side (CUDA_MEMCPY2D, CUDA_MEMCPY3D): the pointer its memory type says is used,
// at the offsets of its host pointer, device pointer and array (each 8 bytes after the type).
struct DescriptorSide {
  uint32_t type;
  uint64_t ptr;
};
DescriptorSide descriptor_side(const EntryData& d, size_t type_offset) {
  const uint32_t t = d.get<uint32_t>(type_offset);
  const size_t at = t == kHost ? 8 : t == kArray ? 24 : 16;  // host, array, else device (unified too)
  return {t, d.get<uint64_t>(type_offset + at)};
}

void descriptor_copy(const EntryData& d, size_t src_type, size_t dst_type, CallEvent& e) {
  const auto s = descriptor_side(d, src_type), t = descriptor_side(d, dst_type);
  e.src = s.ptr;
  e.ptr = t.ptr;
  e.device_sides = (s.type == kArray ? kSrc : 0) | (t.type == kArray ? kDst : 0);
  e.dir = d.ok() ? dir_from_sides(mem_side(s.type), mem_side(t.type)) : cuda::CopyDir::Unknown;
}

// cudaMemcpy3DParms and cudaMemcpy3DPeerParms: each side is an array or a pitched pointer, the
// extent in the array's elements (bytes when no array takes part).
struct Runtime3D {
  size_t src_array, src_ptr, dst_array, dst_ptr, extent;
};
constexpr Runtime3D kParms3D{0, 32, 64, 96, 128};
constexpr Runtime3D kPeerParms3D{0, 32, 72, 104, 144};

void runtime_3d(const EntryData& d, const Runtime3D& at, CallEvent& e) {
  const uint64_t src_array = d.get<uint64_t>(at.src_array), dst_array = d.get<uint64_t>(at.dst_array);
  e.src = src_array ? src_array : d.get<uint64_t>(at.src_ptr);
  e.ptr = dst_array ? dst_array : d.get<uint64_t>(at.dst_ptr);
  e.device_sides = (src_array ? kSrc : 0) | (dst_array ? kDst : 0);
  const uint64_t elems =
      d.get<uint64_t>(at.extent) * d.get<uint64_t>(at.extent + 8) * d.get<uint64_t>(at.extent + 16);
  if (!d.ok())
    e.bytes_known = false;
  else if (src_array || dst_array)  // both: the runtime refuses arrays of different element sizes
    e.in_elements[0] = {dst_array ? dst_array : src_array, elems};
  else
    e.bytes = elems;
}

void batch_sizes(const EntryData& d, uint64_t count, CallEvent& e) {
  const auto b = d.get_struct<gs_batch_entry>();
  e.copies = count;
  e.bytes = b.bytes;
  // Not all sizes read (more than GS_BATCH_MAX_SIZES, or unreadable): the total is not known.
  e.bytes_known = d.ok() && b.summed == count;
  // The batch's direction is its first copy's, from the tracked allocations.
  e.ptr = b.dst0;
  e.src = b.src0;
  e.dir = d.ok() ? cuda::CopyDir::Default : cuda::CopyDir::Unknown;
}

void batch_3d_ops(const EntryData& d, uint64_t count, CallEvent& e) {
  const auto b = d.get_struct<gs_batch3d_entry>();
  e.copies = count;
  e.bytes = b.bytes;
  for (int i = 0; i < 2; ++i) e.in_elements[i] = {b.array[i], b.elems[i]};
  e.bytes_known = d.ok() && b.ops == count && b.other_ops == 0;
  e.src = b.src0;
  e.ptr = b.dst0;
  e.device_sides = (b.src0_type == GS_MEMCPY_OPERAND_ARRAY ? kSrc : 0) | (b.dst0_type == GS_MEMCPY_OPERAND_ARRAY ? kDst : 0);
  e.dir = d.ok() ? cuda::CopyDir::Default : cuda::CopyDir::Unknown;
}

// The size of an array created with these extents (a 0 height or depth: a 1-D or 2-D array).
uint64_t array_bytes(uint32_t elem, uint64_t w, uint64_t h, uint64_t depth) {
  return uint64_t(elem) * w * std::max<uint64_t>(h, 1) * std::max<uint64_t>(depth, 1);
}

}  // namespace

uint32_t channel_desc_element_size(int32_t x, int32_t y, int32_t z, int32_t w, int32_t kind) {
  // cudaChannelFormatKindSigned, Unsigned, Float; the normalized 8/16-bit kinds (5..16); 10-10-10-2 (31).
  const bool whole = (kind >= 0 && kind <= 2) || (kind >= 5 && kind <= 16) || kind == 31;
  if (!whole || x < 0 || y < 0 || z < 0 || w < 0) return 0;
  const uint32_t bits = uint32_t(x) + uint32_t(y) + uint32_t(z) + uint32_t(w);
  return bits % 8 ? 0 : bits / 8;
}

uint32_t array_format_element_size(uint32_t format, uint32_t channels) {
  switch (format) {
    case 0x01: case 0x08: return channels;          // (UN)SIGNED_INT8
    case 0x02: case 0x09: case 0x10: return 2 * channels;  // (UN)SIGNED_INT16, HALF
    case 0x03: case 0x0a: case 0x20: return 4 * channels;  // (UN)SIGNED_INT32, FLOAT
    case 0x50: return 4;                             // UNORM_INT_101010_2
    // UNORM/SNORM_INT8X1..X4, INT16X1..X4: the channels are in the format's name.
    case 0xc0: case 0xc6: return 1;
    case 0xc1: case 0xc7: case 0xc3: case 0xc9: return 2;
    case 0xc2: case 0xc8: case 0xc4: case 0xca: return 4;
    case 0xc5: case 0xcb: return 8;
    default: return 0;                               // block-compressed, YUV
  }
}

cuda::CopyDir runtime_copy_dir(uint64_t kind, uint8_t device_sides) {
  static constexpr char kSides[5][2] = {{'H', 'H'}, {'H', 'D'}, {'D', 'H'}, {'D', 'D'}, {'?', '?'}};
  if (kind > 4) return cuda::CopyDir::Unknown;
  const char src = device_sides & kSrc ? 'D' : kSides[kind][0];
  const char dst = device_sides & kDst ? 'D' : kSides[kind][1];
  return dir_from_sides(src, dst);
}

bool decode_copy_family(const cuda::FunctionSpec& f, const __u64* a, const EntryData& d, CallEvent& e) {
  // A copy whose direction is fixed by the function keeps it; else the runtime's kind at `kind`.
  auto runtime_kind_at = [&](int kind, uint8_t sides) {
    e.device_sides = sides;
    e.dir = f.fixed_dir != cuda::CopyDir::Unknown ? f.fixed_dir : runtime_copy_dir(a[kind], sides);
  };
  auto stream_at = [&](int i) {
    if (f.async) e.stream = a[i];
  };
  switch (f.sig) {
    case cuda::Signature::DrvMemcpy2D:
      descriptor_copy(d, 16, 72, e);
      e.bytes = d.get<uint64_t>(112) * d.get<uint64_t>(120);
      e.bytes_known = d.ok();
      stream_at(1);
      return true;
    case cuda::Signature::DrvMemcpy3D:  // CUDA_MEMCPY3D and CUDA_MEMCPY3D_PEER alike
      descriptor_copy(d, 32, 120, e);
      e.bytes = d.get<uint64_t>(176) * d.get<uint64_t>(184) * d.get<uint64_t>(192);
      e.bytes_known = d.ok();
      if (f.fixed_dir != cuda::CopyDir::Unknown) e.dir = f.fixed_dir;
      stream_at(1);
      return true;
    case cuda::Signature::RtMemcpy3D:
      runtime_3d(d, kParms3D, e);
      e.dir = d.ok() ? runtime_copy_dir(d.get<uint32_t>(152), e.device_sides) : cuda::CopyDir::Unknown;
      stream_at(1);
      return true;
    case cuda::Signature::RtMemcpy3DPeer:
      runtime_3d(d, kPeerParms3D, e);
      e.dir = f.fixed_dir;
      stream_at(1);
      return true;
    case cuda::Signature::RtMemcpyToArray:
      e.ptr = a[0], e.src = a[3], e.bytes = a[4];
      runtime_kind_at(5, kDst);
      stream_at(6);
      return true;
    case cuda::Signature::RtMemcpyFromArray:
      e.ptr = a[0], e.src = a[1], e.bytes = a[4];
      runtime_kind_at(5, kSrc);
      stream_at(6);
      return true;
    case cuda::Signature::RtMemcpyArrayToArray:
      e.ptr = a[0], e.src = a[3], e.bytes = a[6];
      runtime_kind_at(7, kSrc | kDst);
      return true;
    case cuda::Signature::RtMemcpy2DToArray:
      e.ptr = a[0], e.src = a[3], e.bytes = a[5] * a[6];
      runtime_kind_at(7, kDst);
      stream_at(8);
      return true;
    case cuda::Signature::RtMemcpy2DFromArray:
      e.ptr = a[0], e.src = a[2], e.bytes = a[5] * a[6];
      runtime_kind_at(7, kSrc);
      stream_at(8);
      return true;
    case cuda::Signature::RtMemcpy2DArrayToArray:
      e.ptr = a[0], e.src = a[3], e.bytes = a[6] * a[7];
      runtime_kind_at(8, kSrc | kDst);
      return true;
    case cuda::Signature::RtMemcpyToSymbol:
      e.ptr = a[0], e.src = a[1], e.bytes = a[2];
      runtime_kind_at(4, kDst);
      stream_at(5);
      return true;
    case cuda::Signature::RtMemcpyFromSymbol:
      e.ptr = a[0], e.src = a[1], e.bytes = a[2];
      runtime_kind_at(4, kSrc);
      stream_at(5);
      return true;
    case cuda::Signature::MemcpyPairs:
      e.ptr = a[0], e.src = a[2], e.bytes = a[4];
      e.dir = f.fixed_dir;
      e.device_sides = kSrc | kDst;
      stream_at(5);
      return true;
    case cuda::Signature::DrvMemcpyToArray:
      e.ptr = a[0], e.src = a[2], e.bytes = a[3];
      e.dir = f.fixed_dir;
      e.device_sides = kDst;
      stream_at(4);
      return true;
    case cuda::Signature::DrvMemcpyFromArray:
      e.ptr = a[0], e.src = a[1], e.bytes = a[3];
      e.dir = f.fixed_dir;
      e.device_sides = kSrc;
      stream_at(4);
      return true;
    case cuda::Signature::MemcpyBatch:
    case cuda::Signature::MemcpyBatchFailIdx:
      batch_sizes(d, a[3], e);
      stream_at(f.sig == cuda::Signature::MemcpyBatch ? 7 : 8);
      return true;
    case cuda::Signature::Memcpy3DBatch:
    case cuda::Signature::Memcpy3DBatchFailIdx:
      batch_3d_ops(d, a[0], e);
      stream_at(f.sig == cuda::Signature::Memcpy3DBatch ? 3 : 4);
      return true;
    case cuda::Signature::RtArrayAlloc:
    case cuda::Signature::RtArray3DAlloc: {
      struct {
        int32_t x, y, z, w, kind;
      } desc{};
      desc = d.get_struct<decltype(desc)>();
      e.elem_size = channel_desc_element_size(desc.x, desc.y, desc.z, desc.w, desc.kind);
      // cudaMallocArray(out, desc, width, height, flags); the others pass a cudaExtent by value,
      // on the stack past the return address (args 6..8).
      e.bytes = f.sig == cuda::Signature::RtArrayAlloc ? array_bytes(e.elem_size, a[2], a[3], 0)
                                                 : array_bytes(e.elem_size, a[6], a[7], a[8]);
      if (e.out_valid) e.ptr = e.out_handle;
      return true;
    }
    case cuda::Signature::DrvArrayCreate:
      e.elem_size = array_format_element_size(d.get<uint32_t>(16), d.get<uint32_t>(20));
      e.bytes = array_bytes(e.elem_size, d.get<uint64_t>(0), d.get<uint64_t>(8), 0);
      if (e.out_valid) e.ptr = e.out_handle;
      return true;
    case cuda::Signature::DrvArray3DCreate:
      e.elem_size = array_format_element_size(d.get<uint32_t>(24), d.get<uint32_t>(28));
      e.bytes = array_bytes(e.elem_size, d.get<uint64_t>(0), d.get<uint64_t>(8), d.get<uint64_t>(16));
      if (e.out_valid) e.ptr = e.out_handle;
      return true;
    case cuda::Signature::MipmapLevel:
      e.src = a[1];  // the mipmapped array; its level takes its element size
      if (e.out_valid) e.ptr = e.out_handle;
      return true;
    default:
      return false;
  }
}

}  // namespace gpuscope::decode
