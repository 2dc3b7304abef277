#include "report/report.h"

#include <string>
#include <utility>

#include "report/sections/sections.h"

namespace gpuscope::report {

using nlohmann::json;

// Each section is built and rendered in sections/; here they are put in order.
json build_report(store::RecordReader& rec, symbolize::Symbolizer& sym, const Options& opt) {
  Record r = read_record(rec);
  CallSites stacks(r.db, sym);
  const auto stats = function_stats(r.db);
  auto mem = memory(r, stacks, opt.top);
  return {{"summary", summary(rec, r, stats)},
          {"kernels", kernels(r, stacks, opt.top)},
          {"copies", copies(r)},
          {"memory", std::move(mem.processes)},
          {"leaks", std::move(mem.leaks)},
          {"allocation_sites", std::move(mem.allocation_sites)},
          {"errors", errors(r)},
          {"sync", sync(r, stats)},
          {"communication", communication(r)},
          {"rdma", rdma(r)},
          {"cpu", cpu_profile(rec, sym, opt.top)},
          {"gpus", gpus(rec, r)},
          {"gpu_time", gpu_time({r.db, r.origin, r.end, rec.meta("mode") == "command", r.stack_weight}, stacks, opt.top)},
          {"lost", lost(r.db)}};
}

std::string render_text(const json& report) {
  std::string out;
  summary_text(out, report.at("summary"));
  kernels_text(out, report.at("kernels"));
  copies_text(out, report.at("copies"));
  memory_text(out, report.at("memory"));
  leaks_text(out, report.at("leaks"));
  if (report.contains("allocation_sites")) allocation_sites_text(out, report.at("allocation_sites"));
  errors_text(out, report.at("errors"));
  sync_text(out, report.at("sync"));
  if (report.contains("communication")) communication_text(out, report.at("communication"));
  if (report.contains("rdma")) rdma_text(out, report.at("rdma"));
  if (report.contains("cpu")) cpu_text(out, report.at("cpu"));
  if (report.contains("gpu_time")) gpu_time_text(out, report.at("gpu_time"));
  if (report.contains("gpus")) gpus_text(out, report.at("gpus"));
  lost_text(out, report.at("lost"));
  return out;
}

}  // namespace gpuscope::report
