#include "report/sections/sections.h"

#include "report/format.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

}  // namespace

json lost(store::Db& db) {
  json causes = json::array();
  int64_t total = 0;
  auto q = db.prepare("SELECT cause, count FROM lost ORDER BY rowid");
  while (q.step()) {
    causes.push_back({{"cause", q.str(0)}, {"count", q.i64(1)}});
    total += q.i64(1);
  }
  return {{"total", total}, {"counted", !causes.empty()}, {"causes", causes}};
}

void lost_text(std::string& out, const json& lost) {
  heading(out, "Lost events");
  if (!lost.at("counted").get<bool>()) {
    out += "  not known: the recording ended before gpuscope could write its counts\n";
    return;
  }
  if (i64(lost, "total") == 0) {
    out += "  no events lost\n";
    return;
  }
  Table t({"CAUSE", ">COUNT"});
  for (const auto& c : lost.at("causes"))
    if (i64(c, "count")) t.add({str(c, "cause"), num(i64(c, "count"))});
  t.add({"total", num(i64(lost, "total"))});
  out += t.render();
}

}  // namespace gpuscope::report
