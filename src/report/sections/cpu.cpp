#include "report/sections/sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "report/flamegraph.h"
#include "report/format.h"
#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

}  // namespace

json cpu_profile(store::RecordReader& rec, symbolize::Symbolizer& sym, size_t top) {
  if (!rec.db().has_table("samples") || !rec.db().prepare("SELECT 1 FROM samples LIMIT 1").step()) return nullptr;
  const FlameData d = build_flame(rec, sym, FlameOptions{Metric::Cpu});
  std::map<std::string, int64_t> self, total;
  int64_t samples = 0;
  for (const auto& [path, value] : d.stacks) {
    const int64_t n = value / std::max<int64_t>(d.period, 1);
    samples += n;
    self[path.back()] += n;
    std::set<std::string> seen;  // a recursive function counts once per sample
    for (size_t i = 1; i < path.size(); ++i)
      if (seen.insert(path[i]).second) total[path[i]] += n;
  }
  auto ranked = [&](const std::map<std::string, int64_t>& by) {
    std::vector<std::pair<std::string, int64_t>> v(by.begin(), by.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    json out = json::array();
    for (size_t i = 0; i < v.size() && i < top; ++i) out.push_back({{"function", v[i].first}, {"samples", v[i].second}});
    return out;
  };
  return {{"samples", samples}, {"period_ns", d.period}, {"top_self", ranked(self)}, {"top_total", ranked(total)}};
}

void cpu_text(std::string& out, const json& cpu) {
  if (cpu.is_null()) return;  // recorded without --cpu-profile
  const int64_t samples = i64(cpu, "samples");
  heading(out, fmt::format("CPU profile: {} samples, {} of CPU", num(samples), time_text(samples * i64(cpu, "period_ns"))));
  for (const auto& [key, title] : {std::pair{"top_self", "where the CPU was (self)"}, {"top_total", "under (total)"}}) {
    Table t({">SAMPLES", ">SHARE", title});
    for (const auto& f : cpu.at(key))
      t.add({num(i64(f, "samples")), fmt::format("{:.1f}%", 100.0 * i64(f, "samples") / std::max<int64_t>(samples, 1)),
             str(f, "function")});
    out += t.render();
  }
  out += "  (gpuscope flamegraph FILE --metric cpu -o cpu.html draws all of it)\n";
}

}  // namespace gpuscope::report
