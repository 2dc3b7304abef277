#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "cuda/functions.h"
#include "report/call_sites.h"
#include "report/cuda_errors.h"
#include "report/flamegraph.h"
#include "report/format.h"
#include "report/gpu_time.h"
#include "gpu/nvml.h"
#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;
using store::Db;
using store::Stmt;

constexpr size_t kShapes = 5;       // grid/block shapes shown per kernel
constexpr size_t kSites = 3;        // call sites shown per kernel
constexpr size_t kStackFrames = 8;  // frames shown per leak
constexpr int64_t kSeriesPoints = 50;

std::optional<int64_t> to_i64(const std::string& s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() ? std::optional(v) : std::nullopt;
}


// ---------------------------------------------------------------------------------------------
// What the record holds beside the calls.

struct Function {
  std::string name;
  cuda::Api api;
  std::string kind;
};
using Functions = std::map<int64_t, Function>;

// Read from the record, not cuda::all_functions(): a newer gpuscope may have probed more.
Functions read_functions(Db& db) {
  Functions fns;
  auto q = db.prepare("SELECT id, name, api, kind FROM functions");
  while (q.step())
    fns[q.i64(0)] = {q.str(1), q.str(2) == "driver" ? cuda::Api::Driver : cuda::Api::Runtime, q.str(3)};
  return fns;
}

// "1,5,7": the ids of the functions of some kinds, for an IN (...) list.
std::string ids_of(const Functions& fns, std::initializer_list<std::string_view> kinds) {
  std::string out;
  for (const auto& [id, f] : fns)
    if (std::find(kinds.begin(), kinds.end(), f.kind) != kinds.end())
      out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

struct Process {
  std::string comm, cmdline;
  std::optional<int64_t> first_seen_ns, exit_ns, exit_code;
};

struct Record {
  Db& db;
  Functions functions;
  std::map<int64_t, Process> processes;
  int64_t origin = 0;  // the recording's start: every instant in the report counts from it
  int64_t end = 0;     // its end, or for one cut short the end of the last committed call
  // record --stack-every: stacks were taken for one launch, copy or memset in this many, and
  // the SQL over `calls c` of what each row's stack stands for (call_stack_weight_sql).
  int64_t stack_every = 1;
  double stack_budget = 0;  // record --stack-budget: N was chosen per process, stack_every the largest
  std::string stack_weight;

  const Function* function(int64_t id) const {
    auto it = functions.find(id);
    return it == functions.end() ? nullptr : &it->second;
  }
};

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

// ---------------------------------------------------------------------------------------------
// Sections.

struct FunctionStats {
  int64_t calls = 0, nested = 0, total_ns = 0, max_ns = 0;
};

struct ArrayHash {
  template <size_t N>
  size_t operator()(const std::array<int64_t, N>& a) const {
    size_t h = 0;
    for (int64_t v : a) h = (h ^ std::hash<int64_t>{}(v)) * 0x100000001b3;
    return h;
  }
};

// SQLite groups by sorting every row, seconds for millions of calls: the passes over all calls and
// over all launches count in hash maps instead.

// Per function: its top-level calls with their durations, and how many more were made inside
// runtime calls.
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

  std::map<std::string, std::array<int64_t, 2>> by_kind;  // kind → calls per api (runtime, driver)
  int64_t total = 0, nested = 0;
  for (const auto& [func, st] : stats) {
    const Function* f = r.function(func);
    nested += st.nested;
    if (!f || !st.calls) continue;
    by_kind[f->kind][f->api == cuda::Api::Driver] += st.calls;
    total += st.calls;
  }
  json kinds = json::array();
  for (const auto& [kind, n] : by_kind) kinds.push_back({{"kind", kind}, {"runtime", n[0]}, {"driver", n[1]}});
  std::stable_sort(kinds.begin(), kinds.end(), [](const json& a, const json& b) {
    return a["runtime"].get<int64_t>() + a["driver"].get<int64_t>() >
           b["runtime"].get<int64_t>() + b["driver"].get<int64_t>();
  });
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

json kernels(const Record& r, CallSites& stacks, size_t top) {
  // A kernel is its kernels row, or for an unnamed one its handle (kernel_id 0).
  using Key = std::array<int64_t, 2>;
  using Shape = std::array<int64_t, 6>;
  struct Kernel {
    int64_t launches = 0;
    std::unordered_map<Shape, int64_t, ArrayHash> shapes;
    std::unordered_map<int64_t, int64_t> stacks;
  };
  std::unordered_map<Key, Kernel, ArrayHash> all;
  int64_t total = 0;
  // Under --stack-every N a launch's stack was taken for one in N: a call site counts
  // each taken one N times and skips the others.
  auto q = r.db.prepare(
      "SELECT kernel_id, kernel_handle, grid_x, grid_y, grid_z, block_x, block_y, block_z, stack_id, " +
      r.stack_weight + " FROM calls c NOT INDEXED WHERE parent_id IS NULL AND func IN (" +
      ids_of(r.functions, {"launch"}) + ")");
  while (q.step()) {
    const int64_t id = q.i64(0);
    Kernel& k = all[{id, id ? 0 : q.i64(1)}];
    ++k.launches;
    ++k.shapes[{q.i64(2), q.i64(3), q.i64(4), q.i64(5), q.i64(6), q.i64(7)}];
    if (const int64_t w = q.i64(9); w > 0) k.stacks[q.i64(8)] += w;
    ++total;
  }

  std::map<Key, int64_t> launches;
  for (const auto& [key, k] : all) launches[key] = k.launches;
  auto names = r.db.prepare("SELECT name, demangled FROM kernels WHERE id = ?1");
  json out = json::array();
  for (const auto& [k, count] : by_count(launches, top)) {
    const Kernel& kernel = all.at(k);
    std::string symbol, name = fmt::format("[unnamed {:#x}]", uint64_t(k[1]));
    if (k[0] && names.bind(1, k[0]).step()) {
      symbol = names.str(0);
      name = names.str(1).empty() ? symbol : names.str(1);
    }
    names.reset();
    json sh = json::array();
    for (const auto& [s, n] : by_count(kernel.shapes, kShapes))
      sh.push_back({{"grid", {s[0], s[1], s[2]}}, {"block", {s[3], s[4], s[5]}}, {"launches", n}});
    // Different stacks can share their first frame outside CUDA and their Python line.
    std::map<std::pair<std::string, std::string>, int64_t> by_site;
    for (const auto& [stack_id, n] : kernel.stacks)
      by_site[{stacks.python_site(stack_id), stacks.site(stack_id, symbol)}] += n;
    json cs = json::array();
    for (const auto& [site, n] : by_count(by_site, kSites)) {
      json c{{"site", site.second}, {"launches", n}};
      if (!site.first.empty()) c["python"] = site.first;
      cs.push_back(std::move(c));
    }
    out.push_back({{"name", name},
                   {"symbol", symbol},
                   {"launches", count},
                   {"distinct_shapes", kernel.shapes.size()},
                   {"shapes", sh},
                   {"call_sites", cs}});
  }
  json result{{"launches", total}, {"distinct", all.size()}, {"top", out}};
  if (r.stack_every > 1) {
    result["stacks_of_one_in"] = r.stack_every;
    if (r.stack_budget > 0) result["stack_budget"] = r.stack_budget;
  }
  return result;
}

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

struct Usage {
  int64_t in_use = 0, peak = 0, peak_at = 0, allocations = 0, frees = 0, failed = 0;

  void change(int64_t delta, int64_t t) {
    in_use += delta;
    if (in_use > peak) peak = in_use, peak_at = t;
  }
  json to_json() const {
    return {{"peak_bytes", peak},         {"peak_at_ns", peak_at}, {"in_use_at_end_bytes", in_use},
            {"allocations", allocations}, {"frees", frees},        {"failed_allocations", failed}};
  }
};

struct Allocation {
  int64_t bytes, stack_id, func;
  bool pinned;
};

// One process's allocations, replayed in order; device memory is sampled at kSeriesPoints
// instants spread over its life (times relative to the recording's start).
struct ProcessMemory {
  int64_t start, end;
  std::unordered_map<int64_t, Allocation> live;  // by address
  Usage device, pinned;
  json series = json::array();
  int64_t interval_max = 0;  // highest device use since the last point

  int64_t points() const { return end > start ? kSeriesPoints : 1; }
  int64_t point(int64_t k) const { return end > start ? start + (end - start) * k / (kSeriesPoints - 1) : start; }
  // Takes the points before t, with the use as it was before the event at t.
  void sample_before(int64_t t) {
    for (int64_t k = int64_t(series.size()); k < points() && point(k) < t; ++k) {
      series.push_back({{"t_ns", point(k)}, {"bytes", device.in_use}, {"max_bytes", interval_max}});
      interval_max = device.in_use;
    }
  }
};

struct MemoryReport {
  json processes = json::array();
  json leaks;
  json allocation_sites;  // where the most bytes were allocated
};

MemoryReport memory(const Record& r, CallSites& stacks, size_t top) {
  std::map<int64_t, ProcessMemory> procs;
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> alloc_sites;  // (stack, func) -> (count, bytes)
  auto q = r.db.prepare(
      "SELECT pid, ts_ns, func, ret, ptr, bytes, coalesce(stack_id, 0) FROM calls "
      "WHERE parent_id IS NULL AND func IN (" +
      ids_of(r.functions, {"alloc", "free"}) + ") ORDER BY id");
  while (q.step()) {
    const auto* f = cuda::function_by_id(uint16_t(q.i64(2)));
    if (!f) continue;
    const int64_t pid = q.i64(0), t = q.i64(1) - r.origin, ret = q.i64(3), ptr = q.i64(4);
    auto [it, added] = procs.try_emplace(pid, ProcessMemory{0, r.end - r.origin});
    ProcessMemory& p = it->second;
    if (added) {
      if (auto proc = r.processes.find(pid); proc != r.processes.end()) {
        p.start = std::clamp(proc->second.first_seen_ns.value_or(r.origin) - r.origin, int64_t(0), p.end);
        p.end = std::max(proc->second.exit_ns.value_or(r.end) - r.origin, p.start);
      }
    }
    p.sample_before(t);
    if (f->kind == cuda::CallKind::Alloc) {
      const bool pinned = f->mem == cuda::MemKind::PinnedHost;
      if (!pinned && f->mem != cuda::MemKind::Device && f->mem != cuda::MemKind::Managed) continue;
      Usage& u = pinned ? p.pinned : p.device;
      if (ret != 0) {
        ++u.failed;
        continue;
      }
      if (ptr == 0) continue;  // a zero-byte request
      ++u.allocations;
      auto& site = alloc_sites[{q.i64(6), q.i64(2)}];
      ++site.first;
      site.second += q.i64(5);
      // The address handed out again: it was freed by something we did not see.
      if (auto old = p.live.find(ptr); old != p.live.end()) {
        (old->second.pinned ? p.pinned : p.device).change(-old->second.bytes, t);
        p.live.erase(old);
      }
      p.live.emplace(ptr, Allocation{q.i64(5), q.i64(6), q.i64(2), pinned});
      u.change(q.i64(5), t);
    } else {
      auto a = p.live.find(ptr);
      if (ret != 0 || a == p.live.end()) continue;  // failed, or allocated before the recording
      Usage& u = a->second.pinned ? p.pinned : p.device;
      ++u.frees;
      u.change(-a->second.bytes, t);
      p.live.erase(a);
    }
    p.interval_max = std::max(p.interval_max, p.device.in_use);
  }

  MemoryReport out;
  struct Leak {
    int64_t allocations = 0, bytes = 0;
  };
  std::map<std::pair<int64_t, int64_t>, Leak> leaks;  // by (stack, function)
  Leak all;
  for (auto& [pid, p] : procs) {
    p.sample_before(std::numeric_limits<int64_t>::max());
    auto proc = r.processes.find(pid);
    const bool exited = proc != r.processes.end() && proc->second.exit_ns;
    out.processes.push_back({{"pid", pid},
                             {"comm", proc != r.processes.end() ? proc->second.comm : ""},
                             {"end", exited ? "exit" : "recording end"},
                             {"device", p.device.to_json()},
                             {"pinned", p.pinned.to_json()},
                             {"series", std::move(p.series)}});
    for (const auto& [ptr, a] : p.live) {
      auto& l = leaks[{a.stack_id, a.func}];
      for (Leak* x : {&l, &all}) {
        ++x->allocations;
        x->bytes += a.bytes;
      }
    }
  }

  std::vector<std::pair<std::pair<int64_t, int64_t>, Leak>> order(leaks.begin(), leaks.end());
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  if (order.size() > top) order.resize(top);
  json lj = json::array();
  for (const auto& [key, l] : order) {
    const auto [stack_id, func] = key;
    const auto* f = cuda::function_by_id(uint16_t(func));
    json frames = json::array();
    for (const auto& fr : stacks.frames(stack_id)) {
      if (frames.size() == kStackFrames) break;
      frames.push_back(fr.text);
    }
    json leak{{"site", stacks.site(stack_id)},
              {"function", f->symbol},
              {"memory", cuda::to_string(f->mem)},
              {"allocations", l.allocations},
              {"bytes", l.bytes},
              {"stack", frames}};
    if (auto py = stacks.python_site(stack_id); !py.empty()) leak["python"] = py;
    lj.push_back(std::move(leak));
  }
  out.leaks = {{"allocations", all.allocations}, {"bytes", all.bytes}, {"top", lj}};

  std::vector<std::pair<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>> sites(alloc_sites.begin(),
                                                                                          alloc_sites.end());
  std::stable_sort(sites.begin(), sites.end(),
                   [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  if (sites.size() > top) sites.resize(top);
  out.allocation_sites = json::array();
  for (const auto& [key, n] : sites) {
    const auto* f = cuda::function_by_id(uint16_t(key.second));
    json site{{"site", stacks.site(key.first)},
              {"function", f->symbol},
              {"memory", cuda::to_string(f->mem)},
              {"allocations", n.first},
              {"bytes", n.second}};
    if (auto py = stacks.python_site(key.first); !py.empty()) site["python"] = py;
    out.allocation_sites.push_back(std::move(site));
  }
  return out;
}

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

// NVML's view of each GPU over the recording, and each recorded process's share of it.
json gpus(store::RecordReader& rec, const Record& r) {
  json out = {{"metrics", rec.meta("gpu_metrics")}, {"devices", json::array()}};
  if (!has_table(r.db, "gpus")) return out;
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

// The counts are written when a recording ends: one cut short has none.
json lost(Db& db) {
  json causes = json::array();
  int64_t total = 0;
  auto q = db.prepare("SELECT cause, count FROM lost ORDER BY rowid");
  while (q.step()) {
    causes.push_back({{"cause", q.str(0)}, {"count", q.i64(1)}});
    total += q.i64(1);
  }
  return {{"total", total}, {"counted", !causes.empty()}, {"causes", causes}};
}

// ---------------------------------------------------------------------------------------------
// Text.

// The recorder stores death by a signal as the negated signal number.
std::string exit_text(const json& code) {
  if (code.is_null()) return "-";
  const int64_t c = code.get<int64_t>();
  return c < 0 ? fmt::format("signal {}", -c) : std::to_string(c);
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
  Table kinds({"KIND", ">RUNTIME", ">DRIVER"});
  for (const auto& k : calls.at("by_kind")) kinds.add({str(k, "kind"), num(i64(k, "runtime")), num(i64(k, "driver"))});
  if (!calls.at("by_kind").empty()) out += kinds.render();

  out += "CUDA libraries attached:\n";
  Table libs({">PID", ">RUNTIME PROBES", ">DRIVER PROBES", "LIBRARY"});
  for (const auto& l : s.at("libraries"))
    libs.add({std::to_string(i64(l, "pid")), std::to_string(i64(l, "runtime_probes")),
              std::to_string(i64(l, "driver_probes")),
              str(l, "path") + (str(l, "error").empty() ? "" : "  (error: " + str(l, "error") + ")")});
  out += s.at("libraries").empty() ? "  none\n" : libs.render();
}

std::string shape_text(const json& sh) {
  const auto& g = sh.at("grid");
  const auto& b = sh.at("block");
  return fmt::format("grid({},{},{}) block({},{},{}) ×{}", g[0].get<int64_t>(), g[1].get<int64_t>(),
                     g[2].get<int64_t>(), b[0].get<int64_t>(), b[1].get<int64_t>(), b[2].get<int64_t>(),
                     num(i64(sh, "launches")));
}

void kernels_text(std::string& out, const json& k) {
  const auto& top = k.at("top");
  heading(out, fmt::format("Kernels: top {} of {} by launches ({} launches in all)", top.size(),
                           num(i64(k, "distinct")), num(i64(k, "launches"))));
  if (top.empty()) {
    out += "  no kernel launches\n";
    return;
  }
  const bool sampled = k.contains("stacks_of_one_in");
  Table t({">LAUNCHES", "KERNEL"});
  for (const auto& kernel : top) {
    t.add({num(i64(kernel, "launches")), shorten(str(kernel, "name"), 120)});
    const auto& shapes = kernel.at("shapes");
    for (const auto& sh : shapes) t.add({"", "  " + shape_text(sh)});
    if (i64(kernel, "distinct_shapes") > int64_t(shapes.size()))
      t.add({"", fmt::format("  … {} shapes in all", num(i64(kernel, "distinct_shapes")))});
    for (const auto& c : kernel.at("call_sites"))
      t.add({"", "  from " + site_text(c, 110) + (sampled ? " ≈×" : " ×") + num(i64(c, "launches"))});
  }
  out += t.render();
  if (sampled && k.contains("stack_budget"))
    out += fmt::format("  Call sites from the stacks of 1 launch in up to {} (record --stack-budget {:g}: their walks "
                       "kept within {:g}% of the process's time): counts are estimates.\n",
                       i64(k, "stacks_of_one_in"), k.at("stack_budget").get<double>(),
                       100 * k.at("stack_budget").get<double>());
  else if (sampled)
    out += fmt::format("  Call sites from the stacks of 1 launch in {} (record --stack-every): counts are "
                       "estimates.\n",
                       i64(k, "stacks_of_one_in"));
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

// Device use over time in one line of block characters; a blank where none was in use.
std::string sparkline(const json& series) {
  static constexpr std::string_view kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  int64_t top = 0;
  for (const auto& p : series) top = std::max(top, i64(p, "max_bytes"));
  std::string line;
  for (const auto& p : series) {
    const int64_t v = i64(p, "max_bytes");
    line += v > 0 ? kBars[(v * 8 - 1) / top] : " ";
  }
  return line;
}

void memory_text(std::string& out, const json& memory) {
  heading(out, "Memory (in use at the end: at the process's exit, or when the recording ended)");
  if (memory.empty()) {
    out += "  no allocations\n";
    return;
  }
  Table t({">PID", "COMM", ">DEVICE PEAK", ">AT", ">DEVICE AT END", ">PINNED PEAK", ">PINNED AT END", ">ALLOCS",
           ">FREES", ">FAILED", "END"});
  std::string plots;
  for (const auto& p : memory) {
    const auto& d = p.at("device");
    const auto& h = p.at("pinned");
    const int64_t peak = i64(d, "peak_bytes");
    t.add({std::to_string(i64(p, "pid")), str(p, "comm"), bytes_text(peak),
           peak ? time_text(i64(d, "peak_at_ns")) : "-", bytes_text(i64(d, "in_use_at_end_bytes")),
           bytes_text(i64(h, "peak_bytes")), bytes_text(i64(h, "in_use_at_end_bytes")),
           num(i64(d, "allocations") + i64(h, "allocations")), num(i64(d, "frees") + i64(h, "frees")),
           num(i64(d, "failed_allocations") + i64(h, "failed_allocations")), str(p, "end")});
    if (peak)
      plots += fmt::format("  {:>7}  {}  peak {}\n", i64(p, "pid"), sparkline(p.at("series")), bytes_text(peak));
  }
  out += t.render();
  if (!plots.empty()) out += "Device memory over each process's life (highest use per interval):\n" + plots;
}

void leaks_text(std::string& out, const json& leaks) {
  const auto& top = leaks.at("top");
  heading(out, fmt::format("Never freed (by the process's exit or the recording's end): {} in {}",
                           bytes_text(i64(leaks, "bytes")), count_of(i64(leaks, "allocations"), "allocation")));
  if (top.empty()) {
    out += "  every allocation seen was freed\n";
    return;
  }
  Table t({">BYTES", ">ALLOCS", "MEMORY", "ALLOCATED AT"});
  for (const auto& l : top) {
    t.add({bytes_text(i64(l, "bytes")), num(i64(l, "allocations")), str(l, "memory"),
           fmt::format("{} by {}", site_text(l, 100), str(l, "function"))});
    for (size_t d = 0; d < l.at("stack").size(); ++d)
      t.add({"", "", "", fmt::format("  #{} {}", d, shorten(l.at("stack")[d].get<std::string>(), 110))});
  }
  out += t.render();
}

void allocation_sites_text(std::string& out, const json& sites) {
  heading(out, "Biggest allocation sites (bytes allocated by successful calls)");
  if (sites.empty()) {
    out += "  no allocations\n";
    return;
  }
  Table t({">BYTES", ">ALLOCS", "MEMORY", "ALLOCATED AT"});
  for (const auto& s : sites)
    t.add({bytes_text(i64(s, "bytes")), num(i64(s, "allocations")), str(s, "memory"),
           fmt::format("{} by {}", site_text(s, 100), str(s, "function"))});
  out += t.render();
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

}  // namespace

// With --cpu-profile: where the sampled CPU time went, by function, from the same named stacks
// as the CPU flame graph. Null when the record has no samples.
json cpu_profile(store::RecordReader& rec, symbolize::Symbolizer& sym, size_t top) {
  if (!has_table(rec.db(), "samples") || !rec.db().prepare("SELECT 1 FROM samples LIMIT 1").step()) return nullptr;
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
  if (report.contains("cpu")) cpu_text(out, report.at("cpu"));
  if (report.contains("gpu_time")) gpu_time_text(out, report.at("gpu_time"));
  if (report.contains("gpus")) gpus_text(out, report.at("gpus"));
  lost_text(out, report.at("lost"));
  return out;
}

}  // namespace gpuscope::report
