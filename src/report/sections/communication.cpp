#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "report/format.h"
#include "report/sections/sections.h"

namespace gpuscope::report {

using nlohmann::json;

namespace {

// nccl-tests' definitions (its doc/PERFORMANCE.md): the size a collective's algorithm bandwidth
// counts, from what one rank passed (`bytes`: count × the type's size), and the factor that makes
// it the bus bandwidth, comparable with the links' own.
double algorithm_bytes(const std::string& f, double bytes, int64_t n) {
  if (n > 0 && (f == "ncclAllGather" || f == "ncclReduceScatter" || f == "ncclAlltoAll")) return bytes * double(n);
  return bytes;
}
double bus_factor(const std::string& f, int64_t n) {
  if (n <= 0) return 0;
  if (f == "ncclAllReduce") return 2.0 * double(n - 1) / double(n);
  if (f == "ncclAllGather" || f == "ncclReduceScatter" || f == "ncclAlltoAll") return double(n - 1) / double(n);
  return 1;
}

struct Kernel {
  int64_t launch_ns, start_ns, end_ns;
};

// Where each NCCL call enqueued its work: the call itself, or for a call inside a group its group's
// ncclGroupEnd (NCCL launches a group's kernels there). The kernels launched from that call's
// thread while it ran are the collective's: from the first kernel's start to the last one's end.
class CollectiveTimes {
 public:
  explicit CollectiveTimes(store::Db& db) {
    if (!db.has_table("gpu_activities")) return;
    auto q = db.prepare(
        "SELECT l.tid, l.ts_ns, a.start_ns, a.end_ns FROM gpu_activities a JOIN calls l ON l.id = a.call_id "
        "JOIN functions f ON f.id = l.func WHERE a.kind = 'kernel' AND f.kind = 'launch' AND l.pid IN "
        "(SELECT DISTINCT c.pid FROM calls c JOIN nccl_calls n ON n.call_id = c.id) ORDER BY l.tid, l.ts_ns");
    while (q.step()) kernels_[q.i64(0)].push_back({q.i64(1), q.i64(2), q.i64(3)});
  }
  bool any() const { return !kernels_.empty(); }
  // The GPU time of the kernels launched on `tid` in [from, to]; 0 if none.
  int64_t gpu_ns(int64_t tid, int64_t from, int64_t to) const {
    auto it = kernels_.find(tid);
    if (it == kernels_.end()) return 0;
    const auto& ks = it->second;
    auto k = std::lower_bound(ks.begin(), ks.end(), from, [](const Kernel& a, int64_t t) { return a.launch_ns < t; });
    int64_t first = INT64_MAX, last = 0;
    for (; k != ks.end() && k->launch_ns <= to; ++k) first = std::min(first, k->start_ns), last = std::max(last, k->end_ns);
    return last > first ? last - first : 0;
  }

 private:
  std::unordered_map<int64_t, std::vector<Kernel>> kernels_;  // tid -> by launch time
};

}  // namespace

json communication(const Record& r) {
  json out = json::array();
  if (!r.db.has_table("nccl_calls")) return out;
  // Each communicator as its process made it (rank, ranks, the identity its ranks share).
  struct Comm {
    int64_t rank = -1, nranks = -1;
    std::string id;
  };
  std::map<std::pair<int64_t, int64_t>, Comm> comms;  // (pid, comm)
  auto made = r.db.prepare(
      "SELECT c.pid, n.comm, n.rank, n.nranks, n.comm_id FROM calls c JOIN nccl_calls n ON n.call_id = c.id "
      "JOIN functions f ON f.id = c.func WHERE f.kind = 'comm_init' AND n.comm IS NOT NULL");
  while (made.step())
    comms[{made.i64(0), made.i64(1)}] = {made.is_null(2) ? -1 : made.i64(2), made.is_null(3) ? -1 : made.i64(3),
                                         made.is_null(4) ? "" : made.str(4)};
  const CollectiveTimes times(r.db);
  // Each group's end: where its calls' kernels were launched.
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> group_ends;  // (tid, group) -> span
  auto ends = r.db.prepare(
      "SELECT c.tid, n.group_id, c.ts_ns, c.ts_ns + coalesce(c.duration_ns, 0) FROM calls c JOIN nccl_calls n "
      "ON n.call_id = c.id JOIN functions f ON f.id = c.func WHERE f.name = 'ncclGroupEnd' AND n.group_id IS NOT NULL");
  while (ends.step()) group_ends[{ends.i64(0), ends.i64(1)}] = {ends.i64(2), ends.i64(3)};

  struct Row {
    int64_t calls = 0, failed = 0, bytes = 0, enqueue_ns = 0, max_enqueue_ns = 0, gpu_calls = 0, gpu_ns = 0;
  };
  // (pid, comm, function, bytes a call)
  std::map<std::tuple<int64_t, int64_t, std::string, int64_t>, Row> rows;
  auto q = r.db.prepare(
      "SELECT c.pid, c.tid, coalesce(n.comm, 0), f.name, coalesce(c.bytes, 0), c.ret, c.ts_ns, "
      "coalesce(c.duration_ns, 0), n.group_id FROM calls c JOIN functions f ON f.id = c.func "
      "JOIN nccl_calls n ON n.call_id = c.id WHERE f.kind IN ('collective', 'p2p')");
  while (q.step()) {
    Row& row = rows[{q.i64(0), q.i64(2), q.str(3), q.i64(4)}];
    ++row.calls;
    row.failed += q.i64(5) != 0;
    row.bytes += q.i64(4);
    row.enqueue_ns += q.i64(7);
    row.max_enqueue_ns = std::max(row.max_enqueue_ns, q.i64(7));
    if (!times.any() || q.i64(5) != 0) continue;
    std::pair<int64_t, int64_t> span{q.i64(6), q.i64(6) + q.i64(7)};
    if (!q.is_null(8)) {
      auto end = group_ends.find({q.i64(1), q.i64(8)});
      if (end == group_ends.end()) continue;
      span = end->second;
    }
    if (const int64_t ns = times.gpu_ns(q.i64(1), span.first, span.second)) {
      ++row.gpu_calls;
      row.gpu_ns += ns;
    }
  }
  for (const auto& [key, row] : rows) {
    const auto& [pid, comm, function, size] = key;
    json j = {{"pid", pid},
              {"comm", fmt::format("{:#x}", uint64_t(comm))},
              {"function", function},
              {"size", size},
              {"calls", row.calls},
              {"failed", row.failed},
              {"bytes", row.bytes},
              {"enqueue_ns", row.enqueue_ns},
              {"max_enqueue_ns", row.max_enqueue_ns}};
    int64_t nranks = -1;
    if (auto it = comms.find({pid, comm}); it != comms.end()) {
      j["rank"] = it->second.rank;
      j["nranks"] = nranks = it->second.nranks;
      if (!it->second.id.empty()) j["comm_id"] = it->second.id;
    }
    if (row.gpu_calls) {
      // nccl-tests' bandwidths of the mean call, GB/s (bytes per ns).
      const double mean_ns = double(row.gpu_ns) / double(row.gpu_calls);
      const double algbw = algorithm_bytes(function, double(size), nranks) / mean_ns;
      j["gpu_calls"] = row.gpu_calls;
      j["gpu_ns"] = row.gpu_ns;
      j["algbw_gbs"] = algbw;
      if (nranks > 0) j["busbw_gbs"] = algbw * bus_factor(function, nranks);
    }
    out.push_back(std::move(j));
  }
  // The most time first (on the GPU where it was measured), then the most bytes.
  std::stable_sort(out.begin(), out.end(), [](const json& a, const json& b) {
    const auto key = [](const json& x) { return std::pair{x.value("gpu_ns", int64_t(0)), i64(x, "bytes")}; };
    return key(a) > key(b);
  });
  return out;
}

void communication_text(std::string& out, const json& comm) {
  if (comm.empty()) return;  // no NCCL: no section
  heading(out, "Communication (NCCL)");
  const bool gpu = std::any_of(comm.begin(), comm.end(), [](const json& c) { return c.contains("gpu_ns"); });
  std::vector<std::string> head{"PID", "COMMUNICATOR", "RANK", "FUNCTION", ">SIZE", ">CALLS", ">FAILED", ">ENQUEUE"};
  if (gpu) head.insert(head.end(), {">GPU MEAN", ">ALGBW", ">BUSBW"});
  Table t(head);
  for (const auto& c : comm) {
    const std::string rank =
        c.contains("rank") && i64(c, "rank") >= 0 ? fmt::format("{}/{}", i64(c, "rank"), i64(c, "nranks")) : "";
    const std::string id = c.contains("comm_id") ? fmt::format("{} ({})", str(c, "comm"), str(c, "comm_id")) : str(c, "comm");
    std::vector<std::string> row{num(i64(c, "pid")), id, rank, str(c, "function"), bytes_text(i64(c, "size")),
                                 num(i64(c, "calls")), num(i64(c, "failed")), time_text(i64(c, "enqueue_ns"))};
    if (gpu) {
      const bool timed = c.contains("gpu_ns");
      row.push_back(timed ? time_text(i64(c, "gpu_ns") / i64(c, "gpu_calls")) : "");
      row.push_back(timed ? fmt::format("{:.1f} GB/s", c["algbw_gbs"].get<double>()) : "");
      row.push_back(c.contains("busbw_gbs") ? fmt::format("{:.1f} GB/s", c["busbw_gbs"].get<double>()) : "");
    }
    t.add(row);
  }
  out += t.render();
  out += "  (ENQUEUE: time in the calls, which return once the work is queued";
  out += gpu ? "; GPU MEAN: the collective's kernels, first start to last end (record --gpu-times), and the\n"
               "  bandwidths of that mean as nccl-tests defines them; a rank's kernel also waits for the ranks that\n"
               "  reach the collective after it)\n"
             : ": the collectives' own times need record --gpu-times)\n";
}

}  // namespace gpuscope::report
