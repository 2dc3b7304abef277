#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "report/format.h"
#include "report/nccl_collectives.h"
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

}  // namespace

json communication(const Record& r) {
  json out = json::array();
  if (!r.db.has_table("nccl_calls")) return out;
  const NcclCollectives nccl = read_nccl_collectives(r.db);
  struct Row {
    int64_t calls = 0, bytes = 0, gpu_calls = 0, gpu_ns = 0;
    // Of those whose return was probed (records before collectives were probed at entry only).
    int64_t returned = 0, failed = 0, enqueue_ns = 0, max_enqueue_ns = 0;
  };
  // (pid, comm, function, bytes a call)
  std::map<std::tuple<int64_t, int64_t, std::string, int64_t>, Row> rows;
  for (const auto& c : nccl.calls) {
    Row& row = rows[{c.pid, c.comm, c.function, c.bytes}];
    ++row.calls;
    row.bytes += c.bytes;
    if (c.returned) {
      ++row.returned;
      row.failed += c.ret != 0;
      row.enqueue_ns += c.enqueue_ns;
      row.max_enqueue_ns = std::max(row.max_enqueue_ns, c.enqueue_ns);
    }
    if (c.gpu_end_ns > c.gpu_start_ns) {
      ++row.gpu_calls;
      row.gpu_ns += c.gpu_end_ns - c.gpu_start_ns;
    }
  }
  for (const auto& [key, row] : rows) {
    const auto& [pid, comm, function, size] = key;
    json j = {{"pid", pid},
              {"comm", fmt::format("{:#x}", uint64_t(comm))},
              {"function", function},
              {"size", size},
              {"calls", row.calls},
              {"bytes", row.bytes}};
    if (row.returned) {
      j["failed"] = row.failed;
      j["enqueue_ns"] = row.enqueue_ns;
      j["max_enqueue_ns"] = row.max_enqueue_ns;
    }
    int64_t nranks = -1;
    if (auto it = nccl.comms.find({pid, comm}); it != nccl.comms.end()) {
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
  const bool returned = std::any_of(comm.begin(), comm.end(), [](const json& c) { return c.contains("enqueue_ns"); });
  std::vector<std::string> head{"PID", "COMMUNICATOR", "RANK", "FUNCTION", ">SIZE", ">CALLS"};
  if (returned) head.insert(head.end(), {">FAILED", ">ENQUEUE"});
  if (gpu) head.insert(head.end(), {">GPU MEAN", ">ALGBW", ">BUSBW"});
  Table t(head);
  for (const auto& c : comm) {
    const std::string rank =
        c.contains("rank") && i64(c, "rank") >= 0 ? fmt::format("{}/{}", i64(c, "rank"), i64(c, "nranks")) : "";
    const std::string id = c.contains("comm_id") ? fmt::format("{} ({})", str(c, "comm"), str(c, "comm_id")) : str(c, "comm");
    std::vector<std::string> row{num(i64(c, "pid")), id, rank, str(c, "function"), bytes_text(i64(c, "size")),
                                 num(i64(c, "calls"))};
    if (returned) {
      row.push_back(c.contains("failed") ? num(i64(c, "failed")) : "");
      row.push_back(c.contains("enqueue_ns") ? time_text(i64(c, "enqueue_ns")) : "");
    }
    if (gpu) {
      const bool timed = c.contains("gpu_ns");
      row.push_back(timed ? time_text(i64(c, "gpu_ns") / i64(c, "gpu_calls")) : "");
      row.push_back(timed ? fmt::format("{:.1f} GB/s", c["algbw_gbs"].get<double>()) : "");
      row.push_back(c.contains("busbw_gbs") ? fmt::format("{:.1f} GB/s", c["busbw_gbs"].get<double>()) : "");
    }
    t.add(row);
  }
  out += t.render();
  // Collectives are probed at entry only (one trap a call): their results and enqueue times are
  // in records made before that.
  if (returned) out += "  (ENQUEUE: time in the calls, which return once the work is queued)\n";
  out += gpu ? "  (GPU MEAN: the collective's kernels, first start to last end (record --gpu-times), and the\n"
               "  bandwidths of that mean as nccl-tests defines them; a rank's kernel also waits for the ranks that\n"
               "  reach the collective after it)\n"
             : "  (the collectives' own times need record --gpu-times)\n";
}

}  // namespace gpuscope::report
