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
  using enum cuda::Signature;
  switch (f.sig) {
    case NcclReduce:  // (send, recv, count, datatype, op, comm, stream)
      e.nccl.emplace();
      collective(a, e, a[2], as_int(a[3]));
      e.nccl->op = as_int(a[4]);
      e.nccl->comm = a[5];
      e.stream = a[6];
      return true;
    case NcclGather:  // (send, recv, count, datatype, comm, stream)
      e.nccl.emplace();
      collective(a, e, a[2], as_int(a[3]));
      e.nccl->comm = a[4];
      e.stream = a[5];
      return true;
    case NcclRooted:  // (send, recv, count, datatype, root, comm, stream)
      e.nccl.emplace();
      collective(a, e, a[2], as_int(a[3]));
      e.nccl->peer = as_int(a[4]);
      e.nccl->comm = a[5];
      e.stream = a[6];
      return true;
    case NcclReduceRooted:  // (send, recv, count, datatype, op, root, comm, stream)
      e.nccl.emplace();
      collective(a, e, a[2], as_int(a[3]));
      e.nccl->op = as_int(a[4]);
      e.nccl->peer = as_int(a[5]);
      e.nccl->comm = a[6];
      e.stream = a[7];
      return true;
    case NcclPeer: {  // (buf, count, datatype, peer or root, comm, stream)
      e.nccl.emplace();
      const __u64 shifted[] = {a[0], a[0], a[1], a[2]};
      collective(shifted, e, a[1], as_int(a[2]));
      e.nccl->peer = as_int(a[3]);
      e.nccl->comm = a[4];
      e.stream = a[5];
      return true;
    }
    case NcclCommInitRank: {  // (comm* out, nranks, rank, [config]); the unique id at arguments 6-9
      e.nccl.emplace();
      e.nccl->nranks = as_int(a[1]);
      e.nccl->rank = as_int(a[2]);
      uint8_t id[32];
      std::memcpy(id, &a[GS_NUM_REG_ARGS], sizeof id);
      e.nccl->id_hash = nccl_id_hash(id, sizeof id);
      if (e.out_valid) e.nccl->comm = e.out_handle;
      return true;
    }
    case NcclCommInitScalable: {  // (comm* out, nranks, rank, nIds, ncclUniqueId* ids, config)
      e.nccl.emplace();
      e.nccl->nranks = as_int(a[1]);
      e.nccl->rank = as_int(a[2]);
      if (d.ok()) {
        uint8_t id[32];
        for (size_t i = 0; i < sizeof id; ++i) id[i] = d.get<uint8_t>(i);
        e.nccl->id_hash = nccl_id_hash(id, sizeof id);
      }
      if (e.out_valid) e.nccl->comm = e.out_handle;
      return true;
    }
    case NcclCommSplit:  // (comm, color, key, comm* out, config)
      e.nccl.emplace();
      e.nccl->parent = a[0];
      e.nccl->color = as_int(a[1]);
      e.nccl->key = as_int(a[2]);
      if (e.out_valid) e.nccl->comm = e.out_handle;
      return true;
    case NcclComm:
      e.nccl.emplace();
      e.nccl->comm = a[0];
      return true;
    default:
      if (f.api != cuda::Api::Nccl) return false;
      e.nccl.emplace();  // a group's start or end
      return true;
  }
}

}  // namespace gpuscope::decode
