#include "report/sections/sections.h"

#include <fmt/format.h>

#include <map>
#include <optional>

#include "gpu/nvml.h"
#include "report/format.h"
#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

}  // namespace

json gpus(store::RecordReader& rec, const Record& r) {
  json out = {{"metrics", rec.meta("gpu_metrics")}, {"devices", json::array()}};
  if (!r.db.has_table("gpus")) return out;
  auto devs = r.db.prepare("SELECT idx, uuid, name, memory_total, power_limit_mw FROM gpus ORDER BY idx");
  auto stats = r.db.prepare(
      "SELECT count(*), avg(gpu_util), max(gpu_util), avg(mem_util), max(mem_used), avg(power_mw), max(power_mw), "
      "max(temperature_c), min(sm_clock_mhz), avg(sm_clock_mhz), max(sm_clock_mhz), avg(pcie_tx_kbs), "
      "avg(pcie_rx_kbs), max(ecc_corrected) - min(ecc_corrected), max(ecc_uncorrected) - min(ecc_uncorrected), "
      "min(ts_ns), max(ts_ns) FROM gpu_samples WHERE gpu = ?1");
  auto reasons = r.db.prepare("SELECT throttle_reasons, count(*) FROM gpu_samples WHERE gpu = ?1 AND throttle_reasons "
                              "IS NOT NULL GROUP BY 1");
  auto procs = r.db.prepare(
      "SELECT pid, count(sm_util), avg(sm_util), max(sm_util), max(used_memory) FROM gpu_process_samples "
      "WHERE gpu = ?1 GROUP BY pid ORDER BY max(used_memory) DESC");
  auto events = r.db.prepare("SELECT ts_ns, kind, value FROM gpu_events WHERE gpu = ?1 ORDER BY ts_ns");
  // GPM's counters: in records made since they were added.
  std::optional<store::Stmt> activity;
  if (r.db.has_column("gpu_samples", "sm_active"))
    activity = r.db.prepare("SELECT count(sm_active), avg(sm_active), avg(sm_occupancy), avg(tensor_active), "
                            "avg(dram_active), avg(CASE WHEN sm_active IS NOT NULL THEN gpu_util END) FROM "
                            "gpu_samples WHERE gpu = ?1");
  auto opt = [](store::Stmt& q, int col) { return q.is_null(col) ? json() : json(q.f64(col)); };
  while (devs.step()) {
    const int64_t idx = devs.i64(0);
    json d{{"index", idx}, {"uuid", devs.str(1)}, {"name", devs.str(2)}, {"memory_total", devs.i64(3)},
           {"power_limit_mw", devs.i64(4)}};
    stats.bind(1, idx);
    if (stats.step()) {
      d["samples"] = stats.i64(0);
      d["gpu_util"] = {{"mean", opt(stats, 1)}, {"max", opt(stats, 2)}};
      d["mem_util_mean"] = opt(stats, 3);
      d["mem_used_max"] = opt(stats, 4);
      d["power_mw"] = {{"mean", opt(stats, 5)}, {"max", opt(stats, 6)}};
      d["temperature_c_max"] = opt(stats, 7);
      d["sm_clock_mhz"] = {{"min", opt(stats, 8)}, {"mean", opt(stats, 9)}, {"max", opt(stats, 10)}};
      d["pcie_kbs_mean"] = {{"tx", opt(stats, 11)}, {"rx", opt(stats, 12)}};
      d["ecc_new"] = {{"corrected", opt(stats, 13)}, {"uncorrected", opt(stats, 14)}};
    }
    stats.reset();
    if (activity) {
      activity->bind(1, idx);
      if (activity->step() && activity->i64(0) > 0)
        d["activity"] = {{"samples", activity->i64(0)},           {"sm_active_mean", opt(*activity, 1)},
                         {"sm_occupancy_mean", opt(*activity, 2)}, {"tensor_active_mean", opt(*activity, 3)},
                         {"dram_active_mean", opt(*activity, 4)},  {"gpu_util_mean", opt(*activity, 5)}};
      activity->reset();
    }
    // Share of samples each throttle reason was active in.
    std::map<std::string, int64_t> by_reason;
    reasons.bind(1, idx);
    while (reasons.step())
      for (const auto& name : gpu::throttle_reason_names(uint64_t(reasons.i64(0)))) by_reason[name] += reasons.i64(1);
    reasons.reset();
    json th = json::object();
    for (const auto& [name, n] : by_reason) th[name] = n;
    d["throttle_samples"] = th;
    json ps = json::array();
    procs.bind(1, idx);
    while (procs.step()) {
      const int64_t pid = procs.i64(0);
      auto p = r.processes.find(pid);
      ps.push_back({{"pid", pid},
                    {"recorded", p != r.processes.end()},
                    {"comm", p != r.processes.end() ? p->second.comm : ""},
                    {"sm_util_mean", opt(procs, 2)},
                    {"sm_util_max", opt(procs, 3)},
                    {"used_memory_max", opt(procs, 4)}});
    }
    procs.reset();
    d["processes"] = ps;
    json ev = json::array();
    events.bind(1, idx);
    while (events.step())
      ev.push_back({{"t_ns", events.i64(0) - r.origin}, {"kind", events.str(1)}, {"value", events.i64(2)}});
    events.reset();
    d["events"] = ev;
    out["devices"].push_back(std::move(d));
  }
  return out;
}

void gpus_text(std::string& out, const json& g) {
  heading(out, "GPUs (NVML)");
  const auto& devs = g.at("devices");
  if (devs.empty()) {
    const std::string why = g.at("metrics").get<std::string>();
    out += "  no GPU metrics" + (why.empty() ? std::string() : ": " + why) + "\n";
    return;
  }
  auto f = [](const json& v, const char* fmtspec, double scale = 1) {
    return v.is_null() ? std::string("-") : fmt::format(fmt::runtime(fmtspec), v.get<double>() * scale);
  };
  for (const auto& d : devs) {
    out += fmt::format("  GPU {} {} ({}), {} samples\n", i64(d, "index"), str(d, "name"), str(d, "uuid"),
                       d.contains("samples") ? num(i64(d, "samples")) : "0");
    if (!d.contains("samples") || i64(d, "samples") == 0) continue;
    out += fmt::format("    utilisation {}% mean, {}% max; memory controller {}% mean\n", f(d["gpu_util"]["mean"], "{:.0f}"),
                       f(d["gpu_util"]["max"], "{:.0f}"), f(d["mem_util_mean"], "{:.0f}"));
    if (d.contains("activity")) {
      const auto& a = d["activity"];
      out += fmt::format("    SMs active {}% mean (occupancy {}%), tensor cores {}%, DRAM bandwidth {}% (GPM; "
                         "utilisation {}% over the same samples)\n",
                         f(a["sm_active_mean"], "{:.0f}"), f(a["sm_occupancy_mean"], "{:.0f}"),
                         f(a["tensor_active_mean"], "{:.0f}"), f(a["dram_active_mean"], "{:.0f}"),
                         f(a["gpu_util_mean"], "{:.0f}"));
    }
    out += fmt::format("    memory used {} max of {}\n",
                       d["mem_used_max"].is_null() ? "-" : bytes_text(int64_t(d["mem_used_max"].get<double>())),
                       bytes_text(i64(d, "memory_total")));
    out += fmt::format("    power {} W mean, {} W max (limit {} W); temperature {} °C max\n",
                       f(d["power_mw"]["mean"], "{:.0f}", 1e-3), f(d["power_mw"]["max"], "{:.0f}", 1e-3),
                       fmt::format("{:.0f}", i64(d, "power_limit_mw") / 1000.0), f(d["temperature_c_max"], "{:.0f}"));
    out += fmt::format("    SM clock {}..{} MHz ({} mean); PCIe {} MB/s to the GPU, {} MB/s from it (means)\n",
                       f(d["sm_clock_mhz"]["min"], "{:.0f}"), f(d["sm_clock_mhz"]["max"], "{:.0f}"),
                       f(d["sm_clock_mhz"]["mean"], "{:.0f}"), f(d["pcie_kbs_mean"]["rx"], "{:.1f}", 1e-3),
                       f(d["pcie_kbs_mean"]["tx"], "{:.1f}", 1e-3));
    std::string th;
    for (const auto& [name, n] : d.at("throttle_samples").items())
      if (name != "gpu_idle")
        th += fmt::format("{}{} {:.0f}%", th.empty() ? "" : ", ", name, 100.0 * n.get<double>() / i64(d, "samples"));
    out += "    clocks held back by: " + (th.empty() ? std::string("nothing") : th) + " (share of samples)\n";
    const auto& ecc = d.at("ecc_new");
    if ((!ecc["corrected"].is_null() && ecc["corrected"].get<double>() > 0) ||
        (!ecc["uncorrected"].is_null() && ecc["uncorrected"].get<double>() > 0))
      out += fmt::format("    ECC errors during the recording: {} corrected, {} uncorrected\n",
                         f(ecc["corrected"], "{:.0f}"), f(ecc["uncorrected"], "{:.0f}"));
    for (const auto& e : d.at("events"))
      out += fmt::format("    {} {} at {}\n", str(e, "kind") == "xid" ? "XID" : str(e, "kind"), i64(e, "value"),
                         time_text(i64(e, "t_ns")));
    for (const auto& p : d.at("processes"))
      out += fmt::format("    PID {}{}: SM {}% mean, {}% max; memory {} max{}\n", i64(p, "pid"),
                         str(p, "comm").empty() ? "" : " " + str(p, "comm"), f(p["sm_util_mean"], "{:.0f}"),
                         f(p["sm_util_max"], "{:.0f}"),
                         p["used_memory_max"].is_null() ? "-" : bytes_text(int64_t(p["used_memory_max"].get<double>())),
                         p["recorded"].get<bool>() ? "" : " (not recorded)");
  }
}

}  // namespace gpuscope::report
