#include <algorithm>
#include <map>
#include <string>

#include <fmt/format.h>

#include "report/format.h"
#include "report/sections/sections.h"

namespace gpuscope::report {

using nlohmann::json;

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
  // Collectives and sends per process, communicator and function.
  auto q = r.db.prepare(
      "SELECT c.pid, coalesce(n.comm, 0), f.name, count(*), sum(c.ret != 0), coalesce(sum(c.bytes), 0), "
      "coalesce(sum(c.duration_ns), 0), max(c.duration_ns) FROM calls c JOIN functions f ON f.id = c.func "
      "JOIN nccl_calls n ON n.call_id = c.id WHERE f.kind IN ('collective', 'p2p') GROUP BY 1, 2, 3");
  while (q.step()) {
    const auto it = comms.find({q.i64(0), q.i64(1)});
    json row = {{"pid", q.i64(0)},
                {"comm", fmt::format("{:#x}", uint64_t(q.i64(1)))},
                {"function", q.str(2)},
                {"calls", q.i64(3)},
                {"failed", q.i64(4)},
                {"bytes", q.i64(5)},
                {"enqueue_ns", q.i64(6)},
                {"max_enqueue_ns", q.is_null(7) ? 0 : q.i64(7)}};
    if (it != comms.end()) {
      row["rank"] = it->second.rank;
      row["nranks"] = it->second.nranks;
      if (!it->second.id.empty()) row["comm_id"] = it->second.id;
    }
    out.push_back(std::move(row));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const json& a, const json& b) { return a["bytes"].get<int64_t>() > b["bytes"].get<int64_t>(); });
  return out;
}

void communication_text(std::string& out, const json& comm) {
  if (comm.empty()) return;  // no NCCL: no section
  heading(out, "Communication (NCCL)");
  Table t({"PID", "COMMUNICATOR", "RANK", "FUNCTION", ">CALLS", ">FAILED", ">BYTES", ">ENQUEUE", ">MAX"});
  for (const auto& c : comm) {
    const std::string rank =
        c.contains("rank") && i64(c, "rank") >= 0 ? fmt::format("{}/{}", i64(c, "rank"), i64(c, "nranks")) : "";
    const std::string id = c.contains("comm_id") ? fmt::format("{} ({})", str(c, "comm"), str(c, "comm_id")) : str(c, "comm");
    t.add({num(i64(c, "pid")), id, rank, str(c, "function"), num(i64(c, "calls")), num(i64(c, "failed")),
           bytes_text(i64(c, "bytes")), time_text(i64(c, "enqueue_ns")), time_text(i64(c, "max_enqueue_ns"))});
  }
  out += t.render();
  out += "  (ENQUEUE: time in the calls, which return once the work is queued; not the collectives' own time)\n";
}

}  // namespace gpuscope::report
