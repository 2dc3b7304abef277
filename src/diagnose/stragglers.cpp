#include "diagnose/stragglers.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "diagnose/findings.h"
#include "store/record_reader.h"

namespace gpuscope::diagnose {

CommunicatorSkew rank_skew(std::string comm_id, int64_t nranks, std::vector<RankCalls> ranks) {
  CommunicatorSkew s;
  s.comm_id = std::move(comm_id);
  s.nranks = nranks;
  if (ranks.size() < 2) return s;
  std::sort(ranks.begin(), ranks.end(), [](const RankCalls& a, const RankCalls& b) { return a.rank < b.rank; });
  size_t n = SIZE_MAX;
  for (const auto& r : ranks) n = std::min(n, r.ts_ns.size());
  s.collectives = n;
  s.ranks.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    s.ranks[i].pid = ranks[i].pid;
    s.ranks[i].rank = ranks[i].rank;
  }
  if (n == 0) return s;
  std::vector<double> lag_ns(ranks.size(), 0), waited_ns(ranks.size(), 0);
  for (size_t k = 0; k < n; ++k) {
    size_t first = 0, last = 0;
    for (size_t i = 1; i < ranks.size(); ++i) {
      if (ranks[i].ts_ns[k] < ranks[first].ts_ns[k]) first = i;
      if (ranks[i].ts_ns[k] > ranks[last].ts_ns[k]) last = i;
    }
    ++s.ranks[last].last;
    for (size_t i = 0; i < ranks.size(); ++i) {
      lag_ns[i] += double(ranks[i].ts_ns[k] - ranks[first].ts_ns[k]);
      waited_ns[i] += double(ranks[last].ts_ns[k] - ranks[i].ts_ns[k]);
    }
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    s.ranks[i].mean_lag_ms = lag_ns[i] / double(n) / 1e6;
    s.ranks[i].waited_ms = waited_ns[i] / 1e6;
    s.ranks[i].first_ns = ranks[i].ts_ns.front();
    s.ranks[i].last_ns = ranks[i].ts_ns[n - 1];
  }
  // The straggler: last at half the collectives or more, and more often than any other rank.
  size_t most = 0;
  for (size_t i = 1; i < s.ranks.size(); ++i)
    if (s.ranks[i].last > s.ranks[most].last) most = i;
  const bool alone = std::count_if(s.ranks.begin(), s.ranks.end(),
                                   [&](const RankSkew& r) { return r.last == s.ranks[most].last; }) == 1;
  if (alone && 2 * s.ranks[most].last >= n) s.straggler = int(most);
  return s;
}

std::vector<CommunicatorSkew> read_rank_skew(store::RecordReader& rec) {
  auto& db = rec.db();
  std::vector<CommunicatorSkew> out;
  if (!db.has_table("nccl_calls")) return out;
  // Each communicator as its process made it: the identity its ranks share, its rank and ranks.
  struct Made {
    std::string id;
    int64_t rank = -1, nranks = 0;
  };
  std::map<std::pair<int64_t, int64_t>, Made> made;  // (pid, comm)
  auto q = db.prepare(
      "SELECT c.pid, n.comm, n.comm_id, n.rank, coalesce(n.nranks, 0) FROM calls c JOIN nccl_calls n ON n.call_id = "
      "c.id JOIN functions f ON f.id = c.func WHERE f.kind = 'comm_init' AND n.comm IS NOT NULL AND n.comm_id IS NOT "
      "NULL AND n.rank IS NOT NULL");
  while (q.step()) made[{q.i64(0), q.i64(1)}] = {q.str(2), q.i64(3), q.i64(4)};
  // Each rank's successful collectives (a failed call reached no one), in its order.
  std::map<std::string, std::map<std::pair<int64_t, uint32_t>, RankCalls>> by_comm;  // id -> (rank, pid)
  std::map<std::string, int64_t> nranks;
  auto c = db.prepare(
      "SELECT c.pid, n.comm, c.ts_ns FROM calls c JOIN nccl_calls n ON n.call_id = c.id JOIN functions f ON f.id = "
      "c.func WHERE f.kind = 'collective' AND coalesce(c.ret, 0) = 0 ORDER BY c.pid, c.ts_ns");
  while (c.step()) {
    auto it = made.find({c.i64(0), c.i64(1)});
    if (it == made.end()) continue;
    auto& r = by_comm[it->second.id][{it->second.rank, uint32_t(c.i64(0))}];
    r.pid = uint32_t(c.i64(0));
    r.rank = it->second.rank;
    r.ts_ns.push_back(uint64_t(c.i64(2)));
    nranks[it->second.id] = it->second.nranks;
  }
  for (auto& [id, ranks] : by_comm) {
    if (ranks.size() < 2) continue;
    std::vector<RankCalls> v;
    for (auto& [key, r] : ranks) v.push_back(std::move(r));
    auto s = rank_skew(id, nranks[id], std::move(v));
    if (s.collectives > 0) out.push_back(std::move(s));
  }
  return out;
}

void add_straggler_findings(const std::vector<CommunicatorSkew>& comms, const ProcessNames& names, uint64_t origin_ns,
                            std::vector<ProcessDiagnosis>& processes) {
  for (const auto& s : comms) {
    if (s.straggler < 0) continue;
    const RankSkew& slow = s.ranks[size_t(s.straggler)];
    for (const RankSkew& r : s.ranks) {
      if (r.pid == slow.pid || r.last_ns <= r.first_ns) continue;
      auto p = std::find_if(processes.begin(), processes.end(), [&](const ProcessDiagnosis& d) { return d.pid == r.pid; });
      if (p == processes.end()) continue;
      const double share = std::min(1.0, r.waited_ms * 1e6 / double(r.last_ns - r.first_ns));
      if (share < kMinShare) continue;
      Finding f;
      f.cause = "straggler";
      f.title = fmt::format("Rank {} of its NCCL communicator holds this rank back", slow.rank);
      f.share = share;
      f.ms_per_step = share * p->p50_ms;
      f.from_ns = r.first_ns > origin_ns ? r.first_ns - origin_ns : 0;
      f.to_ns = r.last_ns > origin_ns ? r.last_ns - origin_ns : 0;
      f.evidence = fmt::format(
          "rank {} ({}) reached {} of the {} collectives of communicator {} last, {:.2f} ms after the first rank on "
          "average; this rank ({}) waited {:.1f} ms for the last rank in all ({} of its time from its first "
          "collective to its last; arrival is when a rank called NCCL)",
          slow.rank, names.of(slow.pid), slow.last, s.collectives, s.comm_id, slow.mean_lag_ms, r.rank, r.waited_ms,
          pct(share));
      f.fix = fmt::format(
          "Find what slows rank {} (its own findings: `gpuscope diagnose` lists its process, pid {}): its data "
          "loading, CPU or GPU; balance the work across ranks, or take its node or GPU out of the job",
          slow.rank, slow.pid);
      f.confidence = 2 * slow.last >= s.collectives + s.collectives / 2 ? "high" : "medium";
      // Ranked by share among the others; a GPU's hardware fault stays first whatever its share.
      std::erase_if(p->findings, [](const Finding& x) { return x.cause == "none"; });
      auto from = p->findings.begin();
      if (from != p->findings.end() && from->cause == "gpu_error") ++from;
      p->findings.insert(std::find_if(from, p->findings.end(), [&](const Finding& x) { return x.share < f.share; }),
                         std::move(f));
    }
  }
}

}  // namespace gpuscope::diagnose
