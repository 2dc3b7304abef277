#include "report/sections/sections.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "report/format.h"
#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

}  // namespace

json copies(const Record& r) {
  json out = json::array();
  // copies: a batch call makes several; bytes_unknown: calls whose size could not be told (a
  // copy in the elements of an array whose creation was not seen), not in bytes.
  auto q = r.db.prepare(
      // total(), not sum(): a float that cannot overflow (sum() of crafted values stopped the
      // report with "integer overflow"); read back as an integer, clamped.
      "SELECT coalesce(dir, 'unknown'), coalesce(host_mem, ''), count(*), total(bytes), "
      "total(duration_ns), coalesce(sum(ret != 0), 0), total(" + call_copies_sql(r.db) + "), "
      "sum(bytes IS NULL) FROM calls c WHERE parent_id IS NULL AND func IN (" +
      ids_of(r.functions, {"memcpy"}) + ") GROUP BY 1, 2 ORDER BY 4 DESC, 3 DESC, 1, 2");
  while (q.step()) {
    json row{{"direction", q.str(0)},
             {"host_memory", q.str(1)},
             {"calls", q.i64(2)},
             {"bytes", q.i64(3)},
             {"cpu_time_ns", q.i64(4)},
             {"failed", q.i64(5)}};
    // Only where they say something: batch copies among the calls, sizes not known.
    if (q.i64(6) != q.i64(2)) row["copies"] = q.i64(6);
    if (q.i64(7)) row["bytes_unknown"] = q.i64(7);
    out.push_back(std::move(row));
  }
  return out;
}

void copies_text(std::string& out, const json& copies) {
  heading(out, "Copies (CPU time: from call to return)");
  if (copies.empty()) {
    out += "  no copies\n";
    return;
  }
  // Batch calls make several copies each: a COPIES column then says how many.
  bool batches = false;
  int64_t calls = 0, n_copies = 0, bytes = 0, unknown = 0, ns = 0, failed = 0;
  for (const auto& c : copies) {
    const int64_t made = c.contains("copies") ? i64(c, "copies") : i64(c, "calls");
    batches |= made != i64(c, "calls");
    calls += i64(c, "calls");
    n_copies += made;
    bytes += i64(c, "bytes");
    unknown += c.contains("bytes_unknown") ? i64(c, "bytes_unknown") : 0;
    ns += i64(c, "cpu_time_ns");
    failed += i64(c, "failed");
  }
  std::vector<std::string> head{"DIRECTION", "HOST MEMORY", ">CALLS", ">BYTES", ">CPU TIME", ">FAILED"};
  if (batches) head.insert(head.begin() + 3, ">COPIES");
  Table t(head);
  auto row = [&](std::string dir, std::string host, int64_t n, int64_t made, int64_t b, int64_t cpu, int64_t f) {
    std::vector<std::string> cells{std::move(dir), std::move(host), num(n), bytes_text(b), time_text(cpu), num(f)};
    if (batches) cells.insert(cells.begin() + 3, num(made));
    t.add(cells);
  };
  for (const auto& c : copies)
    row(str(c, "direction"), str(c, "host_memory").empty() ? "-" : str(c, "host_memory"), i64(c, "calls"),
        c.contains("copies") ? i64(c, "copies") : i64(c, "calls"), i64(c, "bytes"), i64(c, "cpu_time_ns"),
        i64(c, "failed"));
  row("total", "", calls, n_copies, bytes, ns, failed);
  out += t.render();
  if (unknown)
    out += fmt::format("  {} calls of unknown size (in the elements of CUDA arrays whose creation the record did "
                       "not see) are not in BYTES.\n", num(unknown));
}

}  // namespace gpuscope::report
