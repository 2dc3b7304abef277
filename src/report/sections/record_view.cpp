#include "report/sections/record_view.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <unordered_map>

#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

using store::Db;

std::optional<int64_t> to_i64(const std::string& s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() ? std::optional(v) : std::nullopt;
}

// Read from the record, not cuda::all_functions(): a newer gpuscope may have probed more.
Functions read_functions(Db& db) {
  Functions fns;
  auto q = db.prepare("SELECT id, name, api, kind FROM functions");
  while (q.step())
    fns[q.i64(0)] = {q.str(1), q.str(2) == "driver" ? cuda::Api::Driver : q.str(2) == "nccl" ? cuda::Api::Nccl : cuda::Api::Runtime, q.str(3)};
  return fns;
}

}  // namespace

std::string ids_of(const Functions& fns, std::initializer_list<std::string_view> kinds) {
  std::string out;
  for (const auto& [id, f] : fns)
    if (std::find(kinds.begin(), kinds.end(), f.kind) != kinds.end())
      out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

Record read_record(store::RecordReader& rec) {
  Record r{rec.db(), read_functions(rec.db()), {}, 0, 0, 1, 0, call_stack_weight_sql(rec.db())};
  auto p = r.db.prepare("SELECT pid, comm, cmdline, first_seen_ns, exit_ns, exit_code FROM processes ORDER BY pid");
  auto opt = [&](int col) { return p.is_null(col) ? std::nullopt : std::optional(p.i64(col)); };
  while (p.step()) r.processes[p.i64(0)] = {p.str(1), p.str(2), opt(3), opt(4), opt(5)};

  // Calls are numbered in order of arrival: the first and last rows bound the recording.
  auto first = r.db.prepare("SELECT ts_ns FROM calls ORDER BY id LIMIT 1");
  auto last = r.db.prepare("SELECT ts_ns + coalesce(duration_ns, 0) FROM calls ORDER BY id DESC LIMIT 1");
  const int64_t first_call = first.step() ? first.i64(0) : 0;
  int64_t last_event = last.step() ? last.i64(0) : first_call;
  for (const auto& [pid, proc] : r.processes) last_event = std::max(last_event, proc.exit_ns.value_or(0));
  r.origin = to_i64(rec.meta("start_ns")).value_or(first_call);
  r.end = std::max(to_i64(rec.meta("end_ns")).value_or(last_event), r.origin);
  r.stack_every = std::max<int64_t>(
      to_i64(rec.meta("stack_every")).value_or(to_i64(rec.meta("stack_every_max")).value_or(1)), 1);
  r.stack_budget = std::strtod(rec.meta("stack_budget", "0").c_str(), nullptr);
  return r;
}

std::map<int64_t, FunctionStats> function_stats(Db& db) {
  std::unordered_map<int64_t, FunctionStats> stats;
  auto q = db.prepare("SELECT func, parent_id IS NULL, duration_ns FROM calls");
  while (q.step()) {
    auto& s = stats[q.i64(0)];
    if (q.i64(1)) {
      ++s.calls;
      s.total_ns += q.i64(2);
      s.max_ns = std::max(s.max_ns, q.i64(2));
    } else {
      ++s.nested;
    }
  }
  return {stats.begin(), stats.end()};
}

}  // namespace gpuscope::report
