// Decoders of the copy family past the plain 1-D and 2-D copies: copy descriptors with memory
// types (CUDA_MEMCPY2D, CUDA_MEMCPY3D), 3-D, array, peer, symbol and batch copies, and the array
// creations whose element sizes copies in elements need.
#pragma once

#include <cstdint>

#include "common/model.h"
#include "decode/entry_data.h"
#include "cuda/functions.h"

namespace gpuscope::decode {

// Fills e from a call of one of these signatures; false for any other signature.
bool decode_copy_family(const cuda::FunctionSpec& f, const __u64* args, const EntryData& entry, CallEvent& e);

// Bytes per element of an array, 0 where the format's element is not a whole number of bytes
// per texel (block-compressed and YUV formats): from a cudaChannelFormatDesc (bits per channel
// and cudaChannelFormatKind) ...
uint32_t channel_desc_element_size(int32_t x, int32_t y, int32_t z, int32_t w, int32_t kind);
// ... and from a driver array descriptor's CUarray_format and channel count.
uint32_t array_format_element_size(uint32_t format, uint32_t channels);

// The direction of a runtime copy from its cudaMemcpyKind, with a side that is device memory
// whatever the kind says (CallEvent::device_sides: an array, a symbol) taken as such, as the
// runtime corrects the kind itself. Default where a side is left to the tracked allocations.
cuda::CopyDir runtime_copy_dir(uint64_t kind, uint8_t device_sides);

}  // namespace gpuscope::decode
