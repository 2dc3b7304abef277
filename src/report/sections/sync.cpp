#include "report/sections/sections.h"

#include <algorithm>

#include "report/format.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

}  // namespace

json sync(const Record& r, const std::map<int64_t, FunctionStats>& stats) {
  json out = json::array();
  for (const auto& [func, s] : stats) {
    const Function* f = r.function(func);
    if (!f || f->kind != "sync" || s.calls == 0) continue;
    out.push_back({{"function", f->name},
                   {"calls", s.calls},
                   {"total_ns", s.total_ns},
                   {"mean_ns", s.total_ns / s.calls},
                   {"max_ns", s.max_ns}});
  }
  std::stable_sort(out.begin(), out.end(), [](const json& a, const json& b) {
    return a["total_ns"].get<int64_t>() > b["total_ns"].get<int64_t>();
  });
  return out;
}

void sync_text(std::string& out, const json& sync) {
  heading(out, "Synchronisation");
  if (sync.empty()) {
    out += "  none\n";
    return;
  }
  Table t({"FUNCTION", ">CALLS", ">TOTAL", ">MEAN", ">MAX"});
  for (const auto& s : sync)
    t.add({str(s, "function"), num(i64(s, "calls")), time_text(i64(s, "total_ns")), time_text(i64(s, "mean_ns")),
           time_text(i64(s, "max_ns"))});
  out += t.render();
}

}  // namespace gpuscope::report
