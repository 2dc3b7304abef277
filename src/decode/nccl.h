// Decoders of NCCL's API (cuda::Api::Nccl): collectives, sends and receives with their
// communicator, elements, type, reduction and root or peer; communicators made and ended, with
// the identity every rank of one shares (a hash of the ncclUniqueId they were all given).
#pragma once

#include <cstdint>
#include <string_view>

#include "common/model.h"
#include "cuda/functions.h"
#include "decode/entry_data.h"

namespace gpuscope::decode {

// Fills e (e.nccl, and bytes, buffers and stream) from a call of NCCL's API; false for a function
// of another API.
bool decode_nccl(const cuda::FunctionSpec& f, const __u64* args, const EntryData& entry, CallEvent& e);

// ncclDataType_t: bytes an element (0: unknown), and its name ("" if unknown).
uint32_t nccl_datatype_size(int32_t datatype);
std::string_view nccl_datatype_name(int32_t datatype);
// ncclRedOp_t: "sum" .. "avg", "custom" for those made with ncclRedOpCreate*, "" for none.
std::string_view nccl_op_name(int32_t op);
// A hash of the leading bytes of an ncclUniqueId, 0 never (0 means none).
uint64_t nccl_id_hash(const uint8_t* bytes, size_t n);

}  // namespace gpuscope::decode
