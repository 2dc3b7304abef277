#include "agent/nccl_counters.h"

#include <fmt/format.h>

namespace gpuscope::agent {

void NcclCounters::add(const CallEvent& e, const cuda::FunctionSpec& f) {
  if (!e.nccl) return;
  const NcclArgs& n = *e.nccl;
  const bool ok = !e.has_return || e.ret == 0;
  if (f.kind == cuda::CallKind::CommInit) {
    // The handle read at the return of a communicator's making (ncclCommInitRank, ...Split).
    if (ok && n.comm && (comms_.size() < kMaxCommunicators || comms_.contains(n.comm)))
      comms_[n.comm] = {n.id_hash ? fmt::format("{:016x}", n.id_hash) : "", n.rank, n.nranks};
    return;
  }
  if (f.kind == cuda::CallKind::CommEnd) return;  // its series stay: counters do not go back
  if (f.kind != cuda::CallKind::Collective && f.kind != cuda::CallKind::PeerToPeer) return;
  std::pair key{n.comm, f.id};
  if (!totals_.contains(key) && totals_.size() >= kMaxKeys) key.first = 0;
  Totals& t = totals_[key];
  if (!ok) {
    t.failures += 1;
    return;
  }
  t.calls += 1;
  t.bytes += double(e.bytes);
  t.seconds += double(e.duration_ns) * 1e-9;
}

std::vector<MetricFamily> NcclCounters::make_families() {
  return {
      {"gpuscope_nccl_calls_total", "NCCL collectives and sends/receives enqueued, by communicator, rank and collective", "", MetricType::Counter, {}},
      {"gpuscope_nccl_bytes_total", "Bytes this rank passed to NCCL's collectives and sends/receives (count x the type's size)", "bytes", MetricType::Counter, {}},
      {"gpuscope_nccl_enqueue_seconds_total", "Time spent in NCCL's calls (enqueueing; the transfer runs later on the GPU)", "seconds", MetricType::Counter, {}},
      {"gpuscope_nccl_failures_total", "NCCL calls that returned an error", "", MetricType::Counter, {}},
  };
}

void NcclCounters::append(const Labels& base, std::vector<MetricFamily*> families) const {
  for (const auto& [key, t] : totals_) {
    const auto c = comms_.find(key.first);
    const Communicator comm = c == comms_.end() ? Communicator{} : c->second;
    const auto* f = cuda::function_by_id(key.second);
    std::string collective = f ? std::string(f->symbol) : "?";
    if (collective.starts_with("nccl")) collective.erase(0, 4);  // AllReduce, as NCCL names them
    Labels l = base;
    l.emplace_back("communicator", comm.id);
    l.emplace_back("rank", comm.rank >= 0 ? std::to_string(comm.rank) : "");
    l.emplace_back("ranks", comm.nranks >= 0 ? std::to_string(comm.nranks) : "");
    l.emplace_back("collective", collective);
    const double values[] = {t.calls, t.bytes, t.seconds, t.failures};
    for (size_t i = 0; i < families.size() && i < 4; ++i)
      if (i < 3 ? t.calls > 0 : t.failures > 0) families[i]->samples.push_back({l, values[i]});
  }
}

}  // namespace gpuscope::agent
