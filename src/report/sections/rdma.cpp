#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "report/format.h"
#include "report/sections/sections.h"

namespace gpuscope::report {

using nlohmann::json;

namespace {

// The nearest-rank percentile of sorted values (p in (0, 100]).
int64_t percentile(const std::vector<int64_t>& sorted, double p) {
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * double(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

struct RdmaQp {
  std::string type, state;
  int64_t peer = -1;
  bool sq_sig_all = false, destroyed = false;
  std::map<std::string, std::pair<int64_t, int64_t>> ops;  // opcode -> (work requests, bytes)
  int64_t completions = 0;
  std::map<std::string, int64_t> errors;  // status -> completions
  std::vector<int64_t> latencies;
};

struct RdmaProcess {
  std::map<int64_t, RdmaQp> qps;  // by qp_num
  int64_t registrations = 0, registered_bytes = 0, deregistrations = 0, failed_registrations = 0;
  std::map<std::string, int64_t> direct;  // mlx5dv function -> calls
};

}  // namespace

json rdma(const Record& r) {
  json out = json::array();
  if (!r.db.has_table("rdma_calls")) return out;
  std::map<int64_t, RdmaProcess> procs;
  // QPs as made and moved (in call order: the last state and peer win).
  auto calls = r.db.prepare(
      "SELECT pid, func, ok, qp_num, qp_type, sq_sig_all, state, dest_qp_num, length FROM rdma_calls ORDER BY ts_ns");
  while (calls.step()) {
    RdmaProcess& p = procs[calls.i64(0)];
    const std::string f = calls.str(1);
    const bool ok = calls.i64(2) != 0;
    if (f == "ibv_create_qp" && ok && !calls.is_null(3)) {
      RdmaQp& q = p.qps[calls.i64(3)];
      q.type = calls.str(4);
      q.sq_sig_all = calls.i64(5) != 0;
      q.state = "RESET";
    } else if (f == "ibv_modify_qp" && ok && !calls.is_null(3)) {
      RdmaQp& q = p.qps[calls.i64(3)];
      if (!calls.is_null(6)) q.state = calls.str(6);
      if (!calls.is_null(7)) q.peer = calls.i64(7);
    } else if (f == "ibv_destroy_qp" && ok && !calls.is_null(3)) {
      p.qps[calls.i64(3)].destroyed = true;
    } else if (f == "ibv_reg_mr" || f == "ibv_reg_dmabuf_mr") {
      if (ok) {
        ++p.registrations;
        p.registered_bytes += calls.i64(8);
      } else {
        ++p.failed_registrations;
      }
    } else if (f == "ibv_dereg_mr" && ok) {
      ++p.deregistrations;
    } else if (f.starts_with("mlx5dv_")) {
      ++p.direct[f];
    }
  }
  auto wrs = r.db.prepare("SELECT pid, qp_num, opcode, count(*), sum(bytes) FROM rdma_work_requests GROUP BY 1, 2, 3");
  while (wrs.step()) procs[wrs.i64(0)].qps[wrs.i64(1)].ops[wrs.str(2)] = {wrs.i64(3), wrs.i64(4)};
  auto wcs = r.db.prepare("SELECT pid, qp_num, status, latency_ns FROM rdma_completions ORDER BY latency_ns");
  while (wcs.step()) {
    RdmaQp& q = procs[wcs.i64(0)].qps[wcs.i64(1)];
    ++q.completions;
    if (wcs.str(2) != "success") ++q.errors[wcs.str(2)];
    if (!wcs.is_null(3)) q.latencies.push_back(wcs.i64(3));
  }
  for (auto& [pid, p] : procs) {
    json qps = json::array();
    for (auto& [num, q] : p.qps) {
      json ops = json::object();
      int64_t posted = 0, bytes = 0;
      for (const auto& [op, v] : q.ops) {
        ops[op] = {{"work_requests", v.first}, {"bytes", v.second}};
        posted += v.first;
        bytes += v.second;
      }
      json j = {{"qp_num", num}, {"type", q.type}, {"state", q.state}, {"ops", ops}, {"work_requests", posted},
                {"bytes", bytes}, {"completions", q.completions}, {"errors", q.errors}};
      if (q.peer >= 0) j["peer_qp_num"] = q.peer;
      if (q.sq_sig_all) j["sq_sig_all"] = true;
      if (q.destroyed) j["destroyed"] = true;
      if (!q.latencies.empty()) {
        std::sort(q.latencies.begin(), q.latencies.end());
        j["latency_p50_ns"] = percentile(q.latencies, 50);
        j["latency_p99_ns"] = percentile(q.latencies, 99);
        j["latency_matched"] = q.latencies.size();
      }
      // Connected and idle as far as the provider's probed functions saw: its work went past them
      // (direct verbs, GPU-initiated networking), or there was none.
      if (posted == 0 && q.completions == 0 && q.state == "RTS") j["no_posts_seen"] = true;
      qps.push_back(std::move(j));
    }
    json j = {{"pid", pid},
              {"qps", std::move(qps)},
              {"memory_registrations", {{"count", p.registrations},
                                        {"bytes", p.registered_bytes},
                                        {"deregistered", p.deregistrations},
                                        {"failed", p.failed_registrations}}}};
    if (!p.direct.empty()) j["direct_verbs"] = p.direct;
    out.push_back(std::move(j));
  }
  return out;
}

void rdma_text(std::string& out, const json& rdma) {
  if (rdma.empty()) return;  // no verbs: no section
  heading(out, "RDMA (verbs)");
  Table t({"PID", ">QP", "TYPE", "STATE", ">PEER QP", "OPS", ">BYTES", ">COMPLETIONS", "ERRORS", ">P50", ">P99"});
  bool idle = false;
  for (const auto& p : rdma) {
    for (const auto& q : p.at("qps")) {
      std::string ops, errors;
      for (const auto& [op, v] : q.at("ops").items())
        ops += fmt::format("{}{} {}", ops.empty() ? "" : ", ", i64(v, "work_requests"), op);
      for (const auto& [status, n] : q.at("errors").items())
        errors += fmt::format("{}{} {}", errors.empty() ? "" : ", ", n.get<int64_t>(), status);
      if (q.value("no_posts_seen", false)) {
        ops = "none seen *";
        idle = true;
      }
      const bool timed = q.contains("latency_p50_ns");
      t.add({num(i64(p, "pid")), fmt::format("{:#x}", i64(q, "qp_num")), str(q, "type"),
             str(q, "state") + (q.value("destroyed", false) ? " (destroyed)" : ""),
             q.contains("peer_qp_num") ? fmt::format("{:#x}", i64(q, "peer_qp_num")) : "", ops,
             bytes_text(i64(q, "bytes")), num(i64(q, "completions")), errors,
             timed ? time_text(i64(q, "latency_p50_ns")) : "", timed ? time_text(i64(q, "latency_p99_ns")) : ""});
    }
  }
  out += t.render();
  out += "  (BYTES: the work requests' scatter/gather lengths; P50/P99: from a signalled work request's post to the\n"
         "  return of the poll that found its completion)\n";
  if (idle)
    out += "  * connected, but no post or completion went through the provider's ibv_post_send/ibv_poll_cq: its work\n"
           "  was posted past them (mlx5 direct verbs, GPU-initiated networking), or there was none\n";
  for (const auto& p : rdma) {
    const auto& m = p.at("memory_registrations");
    if (i64(m, "count") || i64(m, "failed"))
      out += fmt::format("  PID {}: {} registered ({}), {} deregistered{}\n", i64(p, "pid"),
                         count_of(i64(m, "count"), "memory region"), bytes_text(i64(m, "bytes")), i64(m, "deregistered"),
                         i64(m, "failed") ? fmt::format(", {} failed", i64(m, "failed")) : "");
    if (p.contains("direct_verbs")) {
      std::string calls;
      for (const auto& [f, n] : p.at("direct_verbs").items())
        calls += fmt::format("{}{} {}", calls.empty() ? "" : ", ", f, n.get<int64_t>());
      out += fmt::format("  PID {} uses mlx5 direct verbs ({}): work on the queues it drives itself is not seen\n",
                         i64(p, "pid"), calls);
    }
  }
}

}  // namespace gpuscope::report
