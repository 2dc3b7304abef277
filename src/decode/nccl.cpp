#include "decode/nccl.h"

#include <array>
#include <cstring>

namespace gpuscope::decode {
namespace {

struct Datatype {
  std::string_view name;
  uint32_t size;
};
// In ncclDataType_t's order (nccl.h, 2.19 to 2.28).
constexpr std::array<Datatype, 12> kDatatypes{{{"int8", 1},
                                               {"uint8", 1},
                                               {"int32", 4},
                                               {"uint32", 4},
                                               {"int64", 8},
                                               {"uint64", 8},
                                               {"float16", 2},
                                               {"float32", 4},
                                               {"float64", 8},
                                               {"bfloat16", 2},
                                               {"fp8e4m3", 1},
                                               {"fp8e5m2", 1}}};
constexpr std::array<std::string_view, 5> kOps{"sum", "prod", "max", "min", "avg"};

int32_t as_int(__u64 v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }

void collective(const __u64* a, CallEvent& e, uint64_t count, int32_t datatype) {
  e.src = a[0];
  e.ptr = a[1];
  e.nccl->count = count;
  e.nccl->datatype = datatype;
  e.bytes = count * nccl_datatype_size(datatype);
  e.bytes_known = nccl_datatype_size(datatype) > 0;
}

}  // namespace

uint32_t nccl_datatype_size(int32_t datatype) {
  return datatype >= 0 && size_t(datatype) < kDatatypes.size() ? kDatatypes[size_t(datatype)].size : 0;
}

std::string_view nccl_datatype_name(int32_t datatype) {
  return datatype >= 0 && size_t(datatype) < kDatatypes.size() ? kDatatypes[size_t(datatype)].name : "";
}

std::string_view nccl_op_name(int32_t op) {
  if (op < 0) return "";
  return size_t(op) < kOps.size() ? kOps[size_t(op)] : "custom";
}

uint64_t nccl_id_hash(const uint8_t* bytes, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h ? h : 1;
}

bool decode_nccl(const cuda::FunctionSpec& f, const __u64* a, const EntryData& d, CallEvent& e) {
  if (f.api != cuda::Api::Nccl) return false;
  NcclArgs& n = e.nccl.emplace();  // a group's start or end has nothing more
  using enum cuda::Signature;
  switch (f.sig) {
    case NcclReduce:  // (send, recv, count, datatype, op, comm, stream)
      collective(a, e, a[2], as_int(a[3]));
      n.op = as_int(a[4]);
      n.comm = a[5];
      e.stream = a[6];
      break;
    case NcclGather:  // (send, recv, count, datatype, comm, stream)
      collective(a, e, a[2], as_int(a[3]));
      n.comm = a[4];
      e.stream = a[5];
      break;
    case NcclRooted:  // (send, recv, count, datatype, root, comm, stream)
      collective(a, e, a[2], as_int(a[3]));
      n.peer = as_int(a[4]);
      n.comm = a[5];
      e.stream = a[6];
      break;
    case NcclReduceRooted:  // (send, recv, count, datatype, op, root, comm, stream)
      collective(a, e, a[2], as_int(a[3]));
      n.op = as_int(a[4]);
      n.peer = as_int(a[5]);
      n.comm = a[6];
      e.stream = a[7];
      break;
    case NcclPeer: {  // (buf, count, datatype, peer or root, comm, stream)
      const __u64 shifted[] = {a[0], a[0], a[1], a[2]};
      collective(shifted, e, a[1], as_int(a[2]));
      n.peer = as_int(a[3]);
      n.comm = a[4];
      e.stream = a[5];
      break;
    }
    case NcclCommInitRank:      // (comm* out, nranks, rank, [config]); the unique id at arguments 6-9
    case NcclCommInitScalable: {  // (comm* out, nranks, rank, nIds, ncclUniqueId* ids, config): read at entry
      n.nranks = as_int(a[1]);
      n.rank = as_int(a[2]);
      uint8_t id[32];
      if (f.sig == NcclCommInitRank) {
        std::memcpy(id, &a[GS_NUM_REG_ARGS], sizeof id);
        n.id_hash = nccl_id_hash(id, sizeof id);
      } else if (d.ok()) {
        for (size_t i = 0; i < sizeof id; ++i) id[i] = d.get<uint8_t>(i);
        n.id_hash = nccl_id_hash(id, sizeof id);
      }
      if (e.out_valid) n.comm = e.out_handle;
      break;
    }
    case NcclCommSplit:  // (comm, color, key, comm* out, config)
      n.parent = a[0];
      n.color = as_int(a[1]);
      n.key = as_int(a[2]);
      if (e.out_valid) n.comm = e.out_handle;
      break;
    case NcclComm:
      n.comm = a[0];
      break;
    default:
      break;
  }
  return true;
}

}  // namespace gpuscope::decode
