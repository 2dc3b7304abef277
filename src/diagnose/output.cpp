#include "diagnose/output.h"

#include <fmt/format.h>

namespace gpuscope::diagnose {

using nlohmann::json;

namespace {

json breakdown_json(const Breakdown& b) {
  if (b.steps <= 0) return nullptr;
  auto per_step_ms = [&](double ns) { return ns / b.steps / 1e6; };
  json j{{"steps", int64_t(b.steps)},
         {"step_ms", per_step_ms(b.window_ns)},
         {"feeding_thread_ms",
          {{"on_cpu", per_step_ms(b.on_cpu)},
           {"on_cpu_in_kernel", per_step_ms(b.sys)},
           {"runnable", per_step_ms(b.runnable)},
           {"io", per_step_ms(b.io)},
           {"lock", per_step_ms(b.lock)},
           {"fd", per_step_ms(b.fd)},
           {"sleep", per_step_ms(b.sleep)},
           {"other", per_step_ms(b.other)},
           {"handoff", per_step_ms(b.handoff)},
           {"unseen", per_step_ms(b.unseen)}}},
         {"cuda_ms",
          {{"all", per_step_ms(b.in_cuda)},
           {"sync", per_step_ms(b.in_sync)},
           {"copies", per_step_ms(b.in_copy)},
           {"pageable_copies", per_step_ms(b.in_pageable_copy)}}},
         {"syncs_per_step", b.syncs / b.steps},
         {"launches_per_step", b.launches / b.steps}};
  if (b.probes > 0) j["cuda_ms"]["gpuscope_probes"] = per_step_ms(b.probes);
  if (const double busy = b.busy_share(); busy >= 0) {
    j["gpu_busy_share"] = busy;
    j["gpu_busy_from"] = b.gpu_known ? "gpu_times" : "nvml";
    // HTA's split of the idle time: launched after the GPU had run out of work.
    if (b.gpu_known) j["gpu_idle_host_late_share"] = b.host_late / b.window_ns;
  }
  if (b.sm_active_n > 0) j["gpu_sm_active_share"] = b.sm_active / b.sm_active_n;
  if (b.sm_n > 0) j["gpu_sm_share"] = {{"own", b.own_sm / b.sm_n}, {"others", b.other_sm / b.sm_n}};
  if (b.pcie_n > 0) j["pcie_gb_per_s"] = b.pcie_bytes_per_s / b.pcie_n / 1e9;
  return j;
}

}  // namespace

json to_json(const Diagnosis& d) {
  json procs = json::array();
  for (const auto& p : d.processes) {
    json findings = json::array();
    for (const auto& f : p.findings)
      findings.push_back({{"cause", f.cause},
                          {"title", f.title},
                          {"share_of_step", f.share},
                          {"ms_per_step", f.ms_per_step},
                          {"window_ns", {f.from_ns, f.to_ns}},
                          {"evidence", f.evidence},
                          {"fix", f.fix},
                          {"confidence", f.confidence}});
    procs.push_back({{"pid", p.pid},
                     {"comm", p.comm},
                     {"cmdline", p.cmdline},
                     {"feeding_tid", p.feeding_tid},
                     {"steps",
                      {{"found", p.steps.count() > 0},
                       {"count", p.step_ms.size()},
                       {"p50_ms", p.p50_ms},
                       {"p90_ms", p.p90_ms},
                       {"slow", p.slow_steps},
                       {"calls_per_step", p.steps.period},
                       {"pattern_similarity", p.steps.similarity}}},
                     {"breakdown", breakdown_json(p.all)},
                     {"slow_breakdown", breakdown_json(p.slow)},
                     {"findings", findings}});
  }
  return {{"host_telemetry", d.host_telemetry}, {"gpu_times", d.gpu_times}, {"notes", d.notes}, {"processes", procs}};
}

std::string render_text(const json& doc) {
  std::string out;
  for (const auto& n : doc.at("notes")) out += fmt::format("Note: {}\n", n.get<std::string>());
  for (const auto& p : doc.at("processes")) {
    const auto& st = p.at("steps");
    out += fmt::format("\n== {} (pid {}) ==\n", p.at("comm").get<std::string>(), p.at("pid").get<int64_t>());
    if (st.at("found").get<bool>())
      out += fmt::format("{} steps: {:.1f} ms (median), {:.1f} ms (p90); {} slow (over 1.25x the median)\n",
                         st.at("count").get<int64_t>(), st.at("p50_ms").get<double>(), st.at("p90_ms").get<double>(),
                         st.at("slow").get<int64_t>());
    else
      out += fmt::format("no repeating pattern of CUDA calls: {} windows of 1 s\n", st.at("count").get<int64_t>());
    if (const auto& b = p.at("breakdown"); !b.is_null()) {
      const auto& t = b.at("feeding_thread_ms");
      out += fmt::format(
          "A step of the thread that feeds the GPU (tid {}): on a CPU {:.1f} ms ({:.1f} of it system time), waiting for "
          "a CPU {:.1f}, I/O {:.1f}, "
          "lock {:.1f}, pipe/socket {:.1f}, sleep {:.1f}, for its other CUDA threads {:.1f}, other {:.1f}, not seen "
          "{:.1f}; in CUDA calls {:.1f} ms (syncs {:.1f}, copies {:.1f}){}\n",
          p.at("feeding_tid").get<int64_t>(), t.at("on_cpu").get<double>(), t.value("on_cpu_in_kernel", 0.0),
          t.at("runnable").get<double>(),
          t.at("io").get<double>(), t.at("lock").get<double>(), t.at("fd").get<double>(), t.at("sleep").get<double>(),
          t.at("handoff").get<double>(),
          t.at("other").get<double>(), t.at("unseen").get<double>(), b.at("cuda_ms").at("all").get<double>(),
          b.at("cuda_ms").at("sync").get<double>(), b.at("cuda_ms").at("copies").get<double>(),
          b.at("cuda_ms").contains("gpuscope_probes")
              ? fmt::format("; gpuscope's probes added {:.2f} ms", b.at("cuda_ms").at("gpuscope_probes").get<double>())
              : "");
      if (b.contains("gpu_busy_share"))
        out += fmt::format("The GPU was busy {:.0f}% of the steps ({}){}; {:.0f} launches a step\n",
                           b.at("gpu_busy_share").get<double>() * 100,
                           b.at("gpu_busy_from") == "nvml" ? "NVML's utilisation" : "kernel times",
                           b.contains("gpu_sm_active_share")
                               ? fmt::format(", its SMs active {:.0f}% (GPM)",
                                             b.at("gpu_sm_active_share").get<double>() * 100)
                               : "",
                           b.at("launches_per_step").get<double>());
    }
    int rank = 0;
    for (const auto& f : p.at("findings")) {
      if (f.at("cause") == "none") {
        out += fmt::format("No problem found: {}\n", f.at("evidence").get<std::string>());
        continue;
      }
      const auto& w = f.at("window_ns");
      out += fmt::format("{}. {} — {:.0f}% of step time ({:.1f} ms a step; {:.1f}..{:.1f} s) [{}]\n", ++rank,
                         f.at("title").get<std::string>(), f.at("share_of_step").get<double>() * 100,
                         f.at("ms_per_step").get<double>(), w[0].get<double>() / 1e9, w[1].get<double>() / 1e9,
                         f.at("cause").get<std::string>());
      out += fmt::format("   Evidence: {}\n   Fix: {}\n", f.at("evidence").get<std::string>(),
                         f.at("fix").get<std::string>());
    }
  }
  return out;
}

}  // namespace gpuscope::diagnose
