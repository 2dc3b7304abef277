#include "report/nccl_collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <unordered_map>

namespace gpuscope::report {
namespace {

struct Kernel {
  int64_t launch_ns, start_ns, end_ns;
};

// The kernels launched from each thread of a process that called NCCL, by launch time: NCCL's
// own, and those whose name is not known (a launch through NCCL's statically linked runtime may
// not have been named).
std::unordered_map<int64_t, std::vector<Kernel>> kernels_by_thread(store::Db& db) {
  std::unordered_map<int64_t, std::vector<Kernel>> out;
  if (!db.has_table("gpu_activities")) return out;
  auto q = db.prepare(
      "SELECT l.tid, l.ts_ns, a.start_ns, a.end_ns FROM gpu_activities a JOIN calls l ON l.id = a.call_id "
      "JOIN functions f ON f.id = l.func LEFT JOIN kernels k ON k.id = l.kernel_id "
      "WHERE a.kind = 'kernel' AND f.kind = 'launch' AND (k.name IS NULL OR k.name LIKE 'nccl%' OR "
      "k.demangled LIKE 'nccl%') AND l.pid IN "
      "(SELECT DISTINCT c.pid FROM calls c JOIN nccl_calls n ON n.call_id = c.id) ORDER BY l.tid, l.ts_ns");
  while (q.step()) out[q.i64(0)].push_back({q.i64(1), q.i64(2), q.i64(3)});
  return out;
}

// Each thread's NCCL calls' entries, in order: a call probed at entry only launched its kernels
// before its thread's next NCCL call.
std::unordered_map<int64_t, std::vector<int64_t>> nccl_entries_by_thread(store::Db& db) {
  std::unordered_map<int64_t, std::vector<int64_t>> out;
  auto q = db.prepare(
      "SELECT c.tid, c.ts_ns FROM calls c JOIN functions f ON f.id = c.func WHERE f.api = 'nccl' ORDER BY c.tid, c.ts_ns");
  while (q.step()) out[q.i64(0)].push_back(q.i64(1));
  return out;
}

}  // namespace

NcclCollectives read_nccl_collectives(store::Db& db, int64_t from_ns, int64_t to_ns, int64_t pid) {
  NcclCollectives out;
  if (!db.has_table("nccl_calls")) return out;
  auto made = db.prepare(
      "SELECT c.pid, n.comm, n.rank, n.nranks, n.comm_id FROM calls c JOIN nccl_calls n ON n.call_id = c.id "
      "JOIN functions f ON f.id = c.func WHERE f.kind = 'comm_init' AND n.comm IS NOT NULL");
  while (made.step())
    out.comms[{made.i64(0), made.i64(1)}] = {made.is_null(2) ? -1 : made.i64(2), made.is_null(3) ? -1 : made.i64(3),
                                             made.is_null(4) ? "" : made.str(4)};
  const auto kernels = kernels_by_thread(db);
  out.gpu_times = !kernels.empty();
  const auto entries = out.gpu_times ? nccl_entries_by_thread(db) : decltype(nccl_entries_by_thread(db)){};
  // Where a call's kernels may have been launched from its thread: from its entry to its return
  // where that was probed, else to the thread's next NCCL call (or the record's end).
  const auto span_of = [&](int64_t tid, int64_t ts_ns, std::optional<int64_t> duration_ns) {
    if (duration_ns) return std::pair{ts_ns, ts_ns + *duration_ns};
    int64_t end = INT64_MAX;
    if (auto it = entries.find(tid); it != entries.end()) {
      auto next = std::upper_bound(it->second.begin(), it->second.end(), ts_ns);
      if (next != it->second.end()) end = *next - 1;
    }
    return std::pair{ts_ns, end};
  };
  // Each group's end: where its calls' kernels were launched.
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> group_ends;  // (tid, group) -> span
  auto ends = db.prepare(
      "SELECT c.tid, n.group_id, c.ts_ns, c.duration_ns FROM calls c JOIN nccl_calls n "
      "ON n.call_id = c.id JOIN functions f ON f.id = c.func WHERE f.name = 'ncclGroupEnd' AND n.group_id IS NOT NULL");
  while (ends.step())
    group_ends[{ends.i64(0), ends.i64(1)}] =
        span_of(ends.i64(0), ends.i64(2), ends.is_null(3) ? std::nullopt : std::optional(ends.i64(3)));

  auto q = db.prepare(fmt::format(
      "SELECT c.id, c.pid, c.tid, coalesce(n.comm, 0), f.name, c.ts_ns, c.duration_ns, "
      "coalesce(c.bytes, 0), coalesce(c.ret, 0), n.group_id FROM calls c JOIN functions f ON f.id = c.func "
      "JOIN nccl_calls n ON n.call_id = c.id WHERE f.kind IN ('collective', 'p2p') AND c.ts_ns >= ?1 AND c.ts_ns <= ?2{} "
      "ORDER BY c.ts_ns",
      pid ? fmt::format(" AND c.pid = {}", pid) : ""));
  q.bind(1, from_ns).bind(2, to_ns > 0 ? to_ns : INT64_MAX);
  while (q.step()) {
    NcclCollective c{q.i64(0), q.i64(1), q.i64(2), q.i64(3), q.str(4), q.i64(5), 0, q.i64(7), q.i64(8)};
    const std::optional<int64_t> duration = q.is_null(6) ? std::nullopt : std::optional(q.i64(6));
    c.returned = duration.has_value();
    c.enqueue_ns = duration.value_or(0);
    if (!q.is_null(9)) c.group = q.i64(9);
    std::pair<int64_t, int64_t> span = span_of(c.tid, c.ts_ns, duration);
    bool launched_where_seen = true;  // a grouped call whose group's end was not seen: none tied
    if (c.group) {
      auto end = group_ends.find({c.tid, *c.group});
      launched_where_seen = end != group_ends.end();
      if (launched_where_seen) span = end->second;
    }
    if (auto it = kernels.find(c.tid); c.ret == 0 && launched_where_seen && it != kernels.end()) {
      const auto& ks = it->second;
      auto k = std::lower_bound(ks.begin(), ks.end(), span.first,
                                [](const Kernel& a, int64_t t) { return a.launch_ns < t; });
      int64_t first = INT64_MAX, last = 0;
      for (; k != ks.end() && k->launch_ns <= span.second; ++k)
        first = std::min(first, k->start_ns), last = std::max(last, k->end_ns);
      if (last > first) c.gpu_start_ns = first, c.gpu_end_ns = last;
    }
    out.calls.push_back(std::move(c));
  }
  return out;
}

}  // namespace gpuscope::report
