#include "gpu/gpu_times.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace gpuscope::gpu {
namespace {

// gpuscope's probe fires at the API function's entry, CUPTI stamps its record inside it; a
// launch gpuscope records in the driver lies inside CUPTI's runtime record. The probe may come
// this much before CUPTI's start (a uprobe costs microseconds on a VM).
constexpr uint64_t kBeforeStartNs = 200'000;

const char* activity_call_kind(uint16_t kind) {
  switch (kind) {
    case GS_GPU_KERNEL: return "launch";
    case GS_GPU_MEMCPY: return "memcpy";
    case GS_GPU_MEMSET: return "memset";
  }
  return "";
}

}  // namespace

GpuTrace read_gpu_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  GpuTrace t;
  if (!in.read(reinterpret_cast<char*>(&t.header), sizeof(t.header)) ||
      std::memcmp(t.header.magic, GS_GPU_TRACE_MAGIC, sizeof(t.header.magic)) != 0)
    throw std::runtime_error(path + " is not a gpuscope GPU trace");
  gs_gpu_record r;
  while (in.read(reinterpret_cast<char*>(&r), sizeof(r))) {
    std::string name;
    if (r.name_len) {
      if (r.name_len > (1u << 20)) {
        t.truncated = true;
        break;
      }
      name.resize(r.name_len);
      if (!in.read(name.data(), r.name_len)) {
        t.truncated = true;
        break;
      }
    }
    if (r.kind == GS_GPU_DROPPED) {
      t.dropped += r.bytes;
      continue;
    }
    if (t.header.clock_offset_ns) {
      r.start = uint64_t(int64_t(r.start) + t.header.clock_offset_ns);
      r.end = uint64_t(int64_t(r.end) + t.header.clock_offset_ns);
    }
    t.records.push_back(r);
    t.names.push_back(std::move(name));
  }
  if (in.gcount() > 0 && in.gcount() < std::streamsize(sizeof(r))) t.truncated = true;
  return t;
}

std::vector<int64_t> correlate(const GpuTrace& trace, const std::vector<RecordedCall>& calls) {
  std::unordered_map<uint32_t, const gs_gpu_record*> api;  // correlation id -> API record
  for (const auto& r : trace.records)
    if (r.kind == GS_GPU_API) {
      // A runtime call and the driver call inside it can share an id: the runtime's is the one
      // activities of runtime launches name, and it spans the driver's.
      auto [it, added] = api.try_emplace(r.correlation, &r);
      if (!added && r.start < it->second->start) it->second = &r;
    }
  std::unordered_set<uint32_t> tids;
  for (const auto& c : calls) tids.insert(c.tid);
  std::vector<int64_t> out(trace.records.size(), 0);
  for (size_t i = 0; i < trace.records.size(); ++i) {
    const auto& r = trace.records[i];
    const char* want = activity_call_kind(r.kind);
    if (!*want) continue;
    auto a = api.find(r.correlation);
    if (a == api.end()) continue;
    const gs_gpu_record& call = *a->second;
    const bool by_thread = tids.count(call.thread) > 0;
    const uint64_t lo = call.start > kBeforeStartNs ? call.start - kBeforeStartNs : 0;
    auto it = std::lower_bound(calls.begin(), calls.end(), lo,
                               [](const RecordedCall& c, uint64_t t) { return c.ts_ns < t; });
    int64_t best = 0;
    uint64_t best_distance = UINT64_MAX;
    for (; it != calls.end() && it->ts_ns <= call.end; ++it) {
      // Kernels, copies and memsets of a CUDA graph carry its cuGraphLaunch's correlation id.
      if ((it->kind != want && it->kind != "graph_launch") || (by_thread && it->tid != call.thread)) continue;
      const uint64_t d = it->ts_ns > call.start ? it->ts_ns - call.start : call.start - it->ts_ns;
      if (d < best_distance) {
        best_distance = d;
        best = it->id;
      }
    }
    out[i] = best;
  }
  return out;
}

}  // namespace gpuscope::gpu
