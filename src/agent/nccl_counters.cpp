#include "agent/nccl_counters.h"

#include <fmt/format.h>

namespace gpuscope::agent {

void NcclCounters::add(const CallEvent& e, const cuda::FunctionSpec& f) {
  if (!e.nccl) return;
  const NcclArgs& n = *e.nccl;
  if (f.kind == cuda::CallKind::CommInit) {
    // The handle read at the return of a communicator's making (ncclCommInitRank, ...Split).
    const bool made = !e.has_return || e.ret == 0;
    if (made && n.comm && (comms_.size() < kMaxCommunicators || comms_.contains(n.comm)))
      comms_[n.comm] = {n.id_hash ? fmt::format("{:016x}", n.id_hash) : "", n.rank, n.nranks};
    return;
  }
  if (f.kind == cuda::CallKind::CommEnd) return;  // its series stay: counters do not go back
  if (f.kind != cuda::CallKind::Collective && f.kind != cuda::CallKind::PeerToPeer) return;
  std::pair key{n.comm, f.id};
  if (!totals_.contains(key) && totals_.size() >= kMaxKeys) key.first = 0;
  Totals& t = totals_[key];
  t.calls += 1;
  t.bytes += double(e.bytes);
}

std::vector<MetricFamily> NcclCounters::make_families() {
  return {
      {"gpuscope_nccl_calls_total", "NCCL collectives and sends/receives called, by communicator, rank and collective", "", MetricType::Counter, {}},
      {"gpuscope_nccl_bytes_total", "Bytes this rank passed to NCCL's collectives and sends/receives (count x the type's size)", "bytes", MetricType::Counter, {}},
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
    const double values[] = {t.calls, t.bytes};
    for (size_t i = 0; i < families.size() && i < 2; ++i) families[i]->samples.push_back({l, values[i]});
  }
}

}  // namespace gpuscope::agent
