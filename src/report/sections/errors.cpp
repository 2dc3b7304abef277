#include "report/sections/sections.h"

#include <fmt/format.h>

#include "report/cuda_errors.h"
#include "report/format.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

}  // namespace

json errors(const Record& r) {
  json out = json::array();
  auto q = r.db.prepare(
      "SELECT func, ret, count(*), min(ts_ns), count(parent_id) FROM calls NOT INDEXED WHERE ret != 0 "
      "GROUP BY 1, 2 ORDER BY 3 DESC, 4");
  while (q.step()) {
    const Function* f = r.function(q.i64(0));
    const int64_t code = q.i64(1);
    out.push_back({{"function", f ? f->name : fmt::format("function {}", q.i64(0))},
                   {"code", code},
                   {"error", f ? cuda_error_name(code, f->api) : ""},
                   {"calls", q.i64(2)},
                   {"nested", q.i64(4)},
                   {"first_at_ns", q.i64(3) - r.origin}});
  }
  return out;
}

void errors_text(std::string& out, const json& errors) {
  heading(out, "Failed calls");
  if (errors.empty()) {
    out += "  none\n";
    return;
  }
  Table t({"FUNCTION", ">CODE", "ERROR", ">CALLS", ">FIRST AT", "NOTE"});
  for (const auto& e : errors)
    t.add({str(e, "function"), std::to_string(i64(e, "code")), str(e, "error").empty() ? "?" : str(e, "error"),
           num(i64(e, "calls")), time_text(i64(e, "first_at_ns")),
           i64(e, "nested") ? fmt::format("{} inside runtime calls", num(i64(e, "nested"))) : ""});
  out += t.render();
}

}  // namespace gpuscope::report
