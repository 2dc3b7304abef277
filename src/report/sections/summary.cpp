#include "report/sections/sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>

#include "cuda/functions.h"
#include "report/format.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

// The recorder stores death by a signal as the negated signal number.
std::string exit_text(const json& code) {
  if (code.is_null()) return "-";
  const int64_t c = code.get<int64_t>();
  return c < 0 ? fmt::format("signal {}", -c) : std::to_string(c);
}

}  // namespace

json summary(store::RecordReader& rec, const Record& r, const std::map<int64_t, FunctionStats>& stats) {
  json s{{"mode", rec.meta("mode")},   {"command", rec.meta("command")},
         {"host", rec.meta("host")},   {"gpuscope_version", rec.meta("gpuscope_version")},
         {"complete", rec.complete()}, {"duration_ns", r.end - r.origin}};

  json procs = json::array();
  for (const auto& [pid, p] : r.processes)
    procs.push_back({{"pid", pid},
                     {"comm", p.comm},
                     {"cmdline", p.cmdline},
                     {"exit_code", p.exit_code ? json(*p.exit_code) : json()}});
  s["processes"] = procs;

  std::map<std::string, std::array<int64_t, 3>> by_kind;  // kind → calls per api (runtime, driver, NCCL)
  int64_t total = 0, nested = 0;
  for (const auto& [func, st] : stats) {
    const Function* f = r.function(func);
    nested += st.nested;
    if (!f || !st.calls) continue;
    by_kind[f->kind][size_t(f->api)] += st.calls;
    total += st.calls;
  }
  json kinds = json::array();
  for (const auto& [kind, n] : by_kind) {
    kinds.push_back({{"kind", kind}, {"runtime", n[0]}, {"driver", n[1]}});
    if (n[2]) kinds.back()["nccl"] = n[2];
  }
  auto calls_of = [](const json& k) {
    return k["runtime"].get<int64_t>() + k["driver"].get<int64_t>() + k.value("nccl", int64_t(0));
  };
  std::stable_sort(kinds.begin(), kinds.end(), [&](const json& a, const json& b) { return calls_of(a) > calls_of(b); });
  s["calls"] = {{"total", total}, {"nested", nested}, {"by_kind", kinds}};

  json libs = json::array();
  auto l = r.db.prepare("SELECT pid, path, build_id, runtime_probes, driver_probes, error FROM libraries ORDER BY id");
  while (l.step())
    libs.push_back({{"pid", l.i64(0)},
                    {"path", l.str(1)},
                    {"build_id", l.str(2)},
                    {"runtime_probes", l.i64(3)},
                    {"driver_probes", l.i64(4)},
                    {"error", l.str(5)}});
  s["libraries"] = libs;
  return s;
}

void summary_text(std::string& out, const json& s) {
  out += fmt::format("gpuscope report: {} ({} mode{})\n", str(s, "command"), str(s, "mode"),
                     str(s, "host").empty() ? "" : ", host " + str(s, "host"));
  out += fmt::format("Recorded for {}.\n", time_text(i64(s, "duration_ns")));
  if (!s.at("complete").get<bool>())
    out +=
        "WARNING: this recording was cut short (gpuscope stopped before it ended); it shows only the calls "
        "committed until then.\n";

  heading(out, "Summary");
  out += "Processes:\n";
  Table procs({">PID", "COMM", ">EXIT", "COMMAND LINE"});
  for (const auto& p : s.at("processes"))
    procs.add(
        {std::to_string(i64(p, "pid")), str(p, "comm"), exit_text(p.at("exit_code")), shorten(str(p, "cmdline"), 100)});
  out += s.at("processes").empty() ? "  none seen\n" : procs.render();

  const auto& calls = s.at("calls");
  out += fmt::format("Calls: {} in all", num(i64(calls, "total")));
  if (i64(calls, "nested"))
    out += fmt::format(" (each counted once; not counting {} made inside runtime calls)",
                       count_of(i64(calls, "nested"), "driver call"));
  out += ":\n";
  const bool nccl = std::any_of(calls.at("by_kind").begin(), calls.at("by_kind").end(),
                                [](const json& k) { return k.contains("nccl"); });
  Table kinds(nccl ? std::vector<std::string>{"KIND", ">RUNTIME", ">DRIVER", ">NCCL"}
                   : std::vector<std::string>{"KIND", ">RUNTIME", ">DRIVER"});
  for (const auto& k : calls.at("by_kind")) {
    std::vector<std::string> row{str(k, "kind"), num(i64(k, "runtime")), num(i64(k, "driver"))};
    if (nccl) row.push_back(num(k.value("nccl", int64_t(0))));
    kinds.add(row);
  }
  if (!calls.at("by_kind").empty()) out += kinds.render();

  out += "CUDA libraries attached:\n";
  Table libs({">PID", ">RUNTIME PROBES", ">DRIVER PROBES", "LIBRARY"});
  for (const auto& l : s.at("libraries"))
    libs.add({std::to_string(i64(l, "pid")), std::to_string(i64(l, "runtime_probes")),
              std::to_string(i64(l, "driver_probes")),
              str(l, "path") + (str(l, "error").empty() ? "" : "  (error: " + str(l, "error") + ")")});
  out += s.at("libraries").empty() ? "  none\n" : libs.render();
}

}  // namespace gpuscope::report
