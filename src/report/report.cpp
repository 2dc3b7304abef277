#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "decode/functions.h"
#include "report/cuda_errors.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;
using store::Stmt;

constexpr size_t kSeriesPoints = 50;
constexpr size_t kLeakFrames = 8;

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Frames inside CUDA's own libraries say how CUDA works, not who called it.
bool is_cuda_module(const std::string& path) {
  const std::string b = base_name(path);
  return b.starts_with("libcudart") || b.starts_with("libcuda.") || b.starts_with("libcupti") ||
         b.starts_with("libnccl");
}

// Symbolises stored stacks on demand, each stack once.
class Stacks {
 public:
  Stacks(store::Db& db, symbolize::Symbolizer& sym)
      : sym_(sym),
        frames_(db.prepare("SELECT sf.module_id, sf.offset, sf.ip, m.path, m.build_id FROM stack_frames sf "
                           "LEFT JOIN modules m ON m.id = sf.module_id WHERE sf.stack_id = ?1 ORDER BY sf.depth")) {}

  struct Entry {
    std::vector<std::string> frames;  // innermost first
    std::vector<std::string> functions;
    std::vector<bool> in_cuda;
    // The caller that matters: the first frame outside CUDA's libraries and outside the
    // launch glue nvcc generates (the kernel's host function and its __device_stub_).
    std::string site(const std::string& kernel = "") const {
      for (size_t i = 0; i < frames.size(); ++i) {
        if (in_cuda[i] || functions[i].starts_with("__device_stub_")) continue;
        if (!kernel.empty() && !functions[i].empty() && kernel.ends_with(functions[i])) continue;
        return frames[i];
      }
      return frames.empty() ? "[no stack]" : frames.back();
    }
  };

  const Entry& get(int64_t stack_id) {
    if (auto it = cache_.find(stack_id); it != cache_.end()) return it->second;
    Entry e;
    frames_.bind(1, stack_id);
    while (frames_.step()) {
      std::string text, function;
      bool cuda = false;
      if (frames_.is_null(0)) {
        text = fmt::format("{:#x}", uint64_t(frames_.i64(2)));
      } else {
        const std::string path = frames_.str(3);
        cuda = is_cuda_module(path);
        auto f = sym_.resolve(path, frames_.str(4), uint64_t(frames_.i64(1)));
        function = f.function;
        text = f.function.empty() ? fmt::format("{}+{:#x}", base_name(path), f.file_offset)
                                  : fmt::format("{}+{:#x} ({})", f.function, f.offset_in_function, base_name(path));
      }
      e.frames.push_back(std::move(text));
      e.functions.push_back(std::move(function));
      e.in_cuda.push_back(cuda);
    }
    frames_.reset();
    return cache_.emplace(stack_id, std::move(e)).first->second;
  }

 private:
  symbolize::Symbolizer& sym_;
  Stmt frames_;
  std::unordered_map<int64_t, Entry> cache_;
};

// Adds up counts per key and keeps the top entries.
template <typename Key>
std::vector<std::pair<Key, int64_t>> top_counts(const std::map<Key, int64_t>& m, size_t n) {
  std::vector<std::pair<Key, int64_t>> v(m.begin(), m.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (v.size() > n) v.resize(n);
  return v;
}

json summary(store::RecordReader& rec) {
  auto& db = rec.db();
  json s;
  s["mode"] = rec.meta("mode");
  s["command"] = rec.meta("command");
  s["host"] = rec.meta("host");
  s["complete"] = rec.complete();
  const int64_t start = std::stoll(rec.meta("start_ns", "0"));
  const int64_t end = std::stoll(rec.meta("end_ns", "0"));
  s["duration_s"] = end > start ? double(end - start) / 1e9 : 0.0;

  json procs = json::array();
  auto p = db.prepare("SELECT pid, comm, cmdline, exit_code FROM processes ORDER BY first_seen_ns");
  while (p.step()) {
    json j{{"pid", p.i64(0)}, {"comm", p.str(1)}, {"cmdline", p.str(2)}};
    j["exit_code"] = p.is_null(3) ? json() : json(p.i64(3));
    procs.push_back(j);
  }
  s["processes"] = procs;

  json kinds = json::object();
  auto k = db.prepare("SELECT f.kind, count(*) FROM calls c JOIN functions f ON f.id = c.func "
                      "WHERE c.parent_id IS NULL GROUP BY f.kind ORDER BY 2 DESC");
  while (k.step()) kinds[k.str(0)] = k.i64(1);
  s["calls_by_kind"] = kinds;

  json libs = json::array();
  auto l = db.prepare("SELECT pid, path, build_id, runtime_probes, driver_probes, error FROM libraries ORDER BY id");
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

json kernels(store::Db& db, Stacks& stacks, size_t top) {
  json out = json::array();
  auto q = db.prepare(
      "SELECT c.kernel_id, k.demangled, CASE WHEN c.kernel_id IS NULL THEN c.kernel_handle END AS h, count(*) "
      "FROM calls c JOIN functions f ON f.id = c.func LEFT JOIN kernels k ON k.id = c.kernel_id "
      "WHERE f.kind = 'launch' AND c.parent_id IS NULL GROUP BY c.kernel_id, h ORDER BY 4 DESC LIMIT ?1");
  q.bind(1, int64_t(top));
  auto shapes = db.prepare(
      "SELECT grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem, count(*) FROM calls c "
      "JOIN functions f ON f.id = c.func WHERE f.kind = 'launch' AND c.parent_id IS NULL "
      "AND c.kernel_id IS ?1 AND (?1 IS NOT NULL OR c.kernel_handle = ?2) GROUP BY 1,2,3,4,5,6,7 ORDER BY 8 DESC");
  auto sites = db.prepare(
      "SELECT stack_id, count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind = 'launch' "
      "AND c.parent_id IS NULL AND c.kernel_id IS ?1 AND (?1 IS NOT NULL OR c.kernel_handle = ?2) GROUP BY 1");
  while (q.step()) {
    json k;
    const bool named = !q.is_null(0);
    const int64_t handle = q.i64(2);
    k["name"] = named ? q.str(1) : fmt::format("[unnamed {:#x}]", uint64_t(handle));
    k["launches"] = q.i64(3);
    for (Stmt* s : {&shapes, &sites}) {
      if (named) s->bind(1, q.i64(0)); else s->bind_null(1);
      s->bind(2, handle);
    }
    json sh = json::array();
    for (int n = 0; shapes.step(); ++n) {
      if (n < 5)
        sh.push_back({{"grid", {shapes.i64(0), shapes.i64(1), shapes.i64(2)}},
                      {"block", {shapes.i64(3), shapes.i64(4), shapes.i64(5)}},
                      {"shared_mem", shapes.i64(6)},
                      {"launches", shapes.i64(7)}});
    }
    shapes.reset();
    k["shapes"] = sh;
    std::map<std::string, int64_t> by_site;
    const std::string kernel_name = k["name"];
    while (sites.step())
      by_site[sites.is_null(0) ? "[no stack]" : stacks.get(sites.i64(0)).site(kernel_name)] += sites.i64(1);
    sites.reset();
    json cs = json::array();
    for (auto& [site, n] : top_counts(by_site, 3)) cs.push_back({{"site", site}, {"launches", n}});
    k["call_sites"] = cs;
    out.push_back(k);
  }
  return out;
}

json copies(store::Db& db) {
  json out = json::array();
  auto q = db.prepare(
      "SELECT coalesce(dir, 'unknown'), coalesce(host_mem, ''), count(*), coalesce(sum(bytes), 0), "
      "coalesce(sum(duration_ns), 0), sum(ret IS NOT NULL AND ret != 0) FROM calls c "
      "JOIN functions f ON f.id = c.func WHERE f.kind = 'memcpy' AND c.parent_id IS NULL "
      "GROUP BY 1, 2 ORDER BY 4 DESC");
  while (q.step())
    out.push_back({{"direction", q.str(0)},
                   {"host_memory", q.str(1)},
                   {"count", q.i64(2)},
                   {"bytes", q.i64(3)},
                   {"cpu_time_ns", q.i64(4)},
                   {"failed", q.i64(5)}});
  return out;
}

// Device (and pinned host) memory over each process's life, and what was never freed.
json memory(store::RecordReader& rec, Stacks& stacks, size_t top) {
  auto& db = rec.db();
  struct Live {
    int64_t bytes;
    int64_t stack_id;
  };
  struct Proc {
    std::unordered_map<int64_t, Live> device, pinned;
    int64_t device_in_use = 0, pinned_in_use = 0, device_peak = 0, pinned_peak = 0, peak_ts = 0;
    int64_t allocs = 0, frees = 0, alloc_failures = 0;
    std::vector<std::pair<int64_t, int64_t>> series;  // (ts, device bytes in use)
  };
  std::map<int64_t, Proc> procs;
  auto q = db.prepare(
      "SELECT c.pid, c.ts_ns, c.func, c.ret, c.ptr, c.bytes, c.stack_id FROM calls c JOIN functions f ON f.id = c.func "
      "WHERE f.kind IN ('alloc', 'free') AND c.parent_id IS NULL ORDER BY c.pid, c.ts_ns");
  while (q.step()) {
    const auto* f = decode::function_by_id(uint16_t(q.i64(2)));
    if (!f) continue;
    Proc& p = procs[q.i64(0)];
    const int64_t ts = q.i64(1), ret = q.i64(3), ptr = q.i64(4), bytes = q.i64(5);
    const bool device = f->mem == decode::MemKind::Device || f->mem == decode::MemKind::Managed;
    auto& live = device ? p.device : p.pinned;
    auto& in_use = device ? p.device_in_use : p.pinned_in_use;
    if (f->kind == decode::CallKind::Alloc) {
      if (ret != 0 || q.is_null(4)) {
        ++p.alloc_failures;
        continue;
      }
      ++p.allocs;
      if (auto old = live.find(ptr); old != live.end()) in_use -= old->second.bytes;
      live[ptr] = Live{bytes, q.is_null(6) ? 0 : q.i64(6)};
      in_use += bytes;
    } else {
      if (ret != 0) continue;
      auto it = live.find(ptr);
      if (it == live.end()) continue;  // freed memory allocated before we attached
      ++p.frees;
      in_use -= it->second.bytes;
      live.erase(it);
    }
    if (device) {
      p.series.emplace_back(ts, in_use);
      if (in_use > p.device_peak) p.device_peak = in_use, p.peak_ts = ts;
    } else {
      p.pinned_peak = std::max(p.pinned_peak, in_use);
    }
  }

  const int64_t record_start = std::stoll(rec.meta("start_ns", "0"));
  json out;
  json per_process = json::array();
  std::map<int64_t, std::pair<int64_t, int64_t>> leaks_by_stack;  // stack -> (count, bytes)
  for (auto& [pid, p] : procs) {
    json series = json::array();
    if (!p.series.empty()) {
      const int64_t t0 = p.series.front().first, t1 = std::max(p.series.back().first, t0 + 1);
      size_t i = 0;
      int64_t cur = 0;
      for (size_t s = 0; s < kSeriesPoints; ++s) {
        const int64_t t = t0 + (t1 - t0) * int64_t(s) / int64_t(kSeriesPoints - 1);
        while (i < p.series.size() && p.series[i].first <= t) cur = p.series[i++].second;
        series.push_back({{"t_s", double(t - record_start) / 1e9}, {"bytes", cur}});
      }
    }
    per_process.push_back({{"pid", pid},
                           {"device_peak_bytes", p.device_peak},
                           {"device_peak_at_s", p.peak_ts ? double(p.peak_ts - record_start) / 1e9 : 0.0},
                           {"device_in_use_at_exit_bytes", p.device_in_use},
                           {"pinned_peak_bytes", p.pinned_peak},
                           {"pinned_in_use_at_exit_bytes", p.pinned_in_use},
                           {"allocations", p.allocs},
                           {"frees", p.frees},
                           {"failed_allocations", p.alloc_failures},
                           {"series", series}});
    for (auto& [ptr, l] : p.device) {
      auto& agg = leaks_by_stack[l.stack_id];
      agg.first += 1;
      agg.second += l.bytes;
    }
  }
  out["processes"] = per_process;

  std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> leaks(leaks_by_stack.begin(), leaks_by_stack.end());
  std::sort(leaks.begin(), leaks.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  json lj = json::array();
  for (size_t i = 0; i < leaks.size() && i < top; ++i) {
    const auto& [stack_id, agg] = leaks[i];
    json frames = json::array();
    std::string site = "[no stack]";
    if (stack_id) {
      const auto& st = stacks.get(stack_id);
      site = st.site();
      for (size_t d = 0; d < st.frames.size() && d < kLeakFrames; ++d) frames.push_back(st.frames[d]);
    }
    lj.push_back({{"site", site}, {"allocations", agg.first}, {"bytes", agg.second}, {"stack", frames}});
  }
  out["leaks"] = lj;
  return out;
}

json errors(store::Db& db) {
  json out = json::array();
  auto q = db.prepare(
      "SELECT c.func, f.name, c.ret, count(*), min(c.ts_ns) FROM calls c JOIN functions f ON f.id = c.func "
      "WHERE c.ret IS NOT NULL AND c.ret != 0 AND c.parent_id IS NULL GROUP BY c.func, c.ret ORDER BY 4 DESC");
  while (q.step()) {
    const auto* f = decode::function_by_id(uint16_t(q.i64(0)));
    const auto name = f ? cuda_error_name(q.i64(2), f->api) : std::string_view{};
    out.push_back({{"function", q.str(1)},
                   {"code", q.i64(2)},
                   {"error", name.empty() ? fmt::format("error {}", q.i64(2)) : std::string(name)},
                   {"count", q.i64(3)},
                   {"first_ns", q.i64(4)}});
  }
  return out;
}

json sync(store::Db& db) {
  json out = json::array();
  auto q = db.prepare(
      "SELECT f.name, count(*), coalesce(sum(duration_ns), 0), coalesce(max(duration_ns), 0) FROM calls c "
      "JOIN functions f ON f.id = c.func WHERE f.kind = 'sync' AND c.parent_id IS NULL GROUP BY f.name ORDER BY 3 DESC");
  while (q.step()) {
    const int64_t n = q.i64(1), total = q.i64(2);
    out.push_back({{"function", q.str(0)},
                   {"count", n},
                   {"total_ns", total},
                   {"mean_ns", n ? total / n : 0},
                   {"max_ns", q.i64(3)}});
  }
  return out;
}

json lost(store::Db& db) {
  json causes = json::object();
  int64_t total = 0;
  auto q = db.prepare("SELECT cause, count FROM lost ORDER BY cause");
  while (q.step()) {
    causes[q.str(0)] = q.i64(1);
    total += q.i64(1);
  }
  return {{"total", total}, {"by_cause", causes}};
}

// ---- text ----

std::string bytes_str(int64_t b) {
  const double v = double(b);
  if (b >= (1LL << 30)) return fmt::format("{:.2f} GiB", v / (1LL << 30));
  if (b >= (1LL << 20)) return fmt::format("{:.2f} MiB", v / (1LL << 20));
  if (b >= (1LL << 10)) return fmt::format("{:.1f} KiB", v / (1LL << 10));
  return fmt::format("{} B", b);
}

std::string time_str(int64_t ns) {
  if (ns >= 1'000'000'000) return fmt::format("{:.2f} s", double(ns) / 1e9);
  if (ns >= 1'000'000) return fmt::format("{:.2f} ms", double(ns) / 1e6);
  if (ns >= 1'000) return fmt::format("{:.1f} µs", double(ns) / 1e3);
  return fmt::format("{} ns", ns);
}

std::string shorten(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 1) + "…"; }

void heading(std::string& out, const std::string& title) { out += fmt::format("\n== {} ==\n", title); }

}  // namespace

json build_report(store::RecordReader& rec, symbolize::Symbolizer& sym, const Options& opt) {
  Stacks stacks(rec.db(), sym);
  json r;
  r["summary"] = summary(rec);
  r["kernels"] = kernels(rec.db(), stacks, opt.top);
  r["copies"] = copies(rec.db());
  r["memory"] = memory(rec, stacks, opt.top);
  r["errors"] = errors(rec.db());
  r["sync"] = sync(rec.db());
  r["lost"] = lost(rec.db());
  return r;
}

std::string render_text(const json& r) {
  std::string out;
  const auto& s = r["summary"];
  out += fmt::format("gpuscope report: {} ({}), {:.2f} s on {}\n", s["command"].get<std::string>(),
                     s["mode"].get<std::string>(), s["duration_s"].get<double>(), s["host"].get<std::string>());
  if (!s["complete"].get<bool>())
    out += "WARNING: this recording was cut short (gpuscope was killed); what it had committed is shown.\n";
  for (const auto& p : s["processes"])
    out += fmt::format("  process {} {}: {}{}\n", p["pid"].get<int64_t>(), p["comm"].get<std::string>(),
                       shorten(p["cmdline"].get<std::string>(), 80),
                       p["exit_code"].is_null() ? "" : fmt::format(" (exit {})", p["exit_code"].get<int64_t>()));
  for (const auto& l : s["libraries"])
    out += fmt::format("  probed {}: {} runtime + {} driver functions{}\n", l["path"].get<std::string>(),
                       l["runtime_probes"].get<int64_t>(), l["driver_probes"].get<int64_t>(),
                       l["error"].get<std::string>().empty() ? "" : " — error: " + l["error"].get<std::string>());
  std::string kinds;
  for (const auto& [k, v] : s["calls_by_kind"].items()) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", v.get<int64_t>(), k);
  out += fmt::format("  calls: {}\n", kinds.empty() ? "none" : kinds);

  heading(out, "Top kernels by launches");
  if (r["kernels"].empty()) out += "  no kernel launches\n";
  for (const auto& k : r["kernels"]) {
    out += fmt::format("{:>9}  {}\n", k["launches"].get<int64_t>(), shorten(k["name"].get<std::string>(), 110));
    for (const auto& sh : k["shapes"])
      out += fmt::format("{:>11}grid({},{},{}) block({},{},{}) smem {} ×{}\n", "", sh["grid"][0].get<int64_t>(),
                         sh["grid"][1].get<int64_t>(), sh["grid"][2].get<int64_t>(), sh["block"][0].get<int64_t>(),
                         sh["block"][1].get<int64_t>(), sh["block"][2].get<int64_t>(), sh["shared_mem"].get<int64_t>(),
                         sh["launches"].get<int64_t>());
    for (const auto& c : k["call_sites"])
      out += fmt::format("{:>11}from {} ×{}\n", "", shorten(c["site"].get<std::string>(), 100),
                         c["launches"].get<int64_t>());
  }

  heading(out, "Copies by direction and host memory");
  if (r["copies"].empty()) out += "  no copies\n";
  else out += fmt::format("  {:<8} {:<9} {:>9} {:>12} {:>12} {:>7}\n", "dir", "host", "count", "bytes", "CPU time", "failed");
  for (const auto& c : r["copies"])
    out += fmt::format("  {:<8} {:<9} {:>9} {:>12} {:>12} {:>7}\n", c["direction"].get<std::string>(),
                       c["host_memory"].get<std::string>(), c["count"].get<int64_t>(), bytes_str(c["bytes"].get<int64_t>()),
                       time_str(c["cpu_time_ns"].get<int64_t>()), c["failed"].get<int64_t>());

  heading(out, "Device memory");
  if (r["memory"]["processes"].empty()) out += "  no allocations\n";
  for (const auto& p : r["memory"]["processes"])
    out += fmt::format("  PID {}: peak {} at {:.2f} s, in use at exit {}; pinned host peak {}; {} allocations, {} frees, {} failed\n",
                       p["pid"].get<int64_t>(), bytes_str(p["device_peak_bytes"].get<int64_t>()),
                       p["device_peak_at_s"].get<double>(), bytes_str(p["device_in_use_at_exit_bytes"].get<int64_t>()),
                       bytes_str(p["pinned_peak_bytes"].get<int64_t>()), p["allocations"].get<int64_t>(),
                       p["frees"].get<int64_t>(), p["failed_allocations"].get<int64_t>());
  if (!r["memory"]["leaks"].empty()) out += "  never freed, by allocation site:\n";
  for (const auto& l : r["memory"]["leaks"])
    out += fmt::format("  {:>12} in {:>5} allocation(s) from {}\n", bytes_str(l["bytes"].get<int64_t>()),
                       l["allocations"].get<int64_t>(), shorten(l["site"].get<std::string>(), 90));

  heading(out, "Failed calls");
  if (r["errors"].empty()) out += "  none\n";
  for (const auto& e : r["errors"])
    out += fmt::format("  {:>9}  {} → {} ({})\n", e["count"].get<int64_t>(), e["function"].get<std::string>(),
                       e["error"].get<std::string>(), e["code"].get<int64_t>());

  heading(out, "Synchronisation");
  if (r["sync"].empty()) out += "  none\n";
  for (const auto& e : r["sync"])
    out += fmt::format("  {:<28} {:>8} calls, {:>10} total, {:>10} mean, {:>10} max\n", e["function"].get<std::string>(),
                       e["count"].get<int64_t>(), time_str(e["total_ns"].get<int64_t>()),
                       time_str(e["mean_ns"].get<int64_t>()), time_str(e["max_ns"].get<int64_t>()));

  heading(out, "Lost events");
  const auto& lost = r["lost"];
  if (lost["total"].get<int64_t>() == 0) {
    out += "  no events lost\n";
  } else {
    for (const auto& [cause, n] : lost["by_cause"].items())
      if (n.get<int64_t>()) out += fmt::format("  {:>9}  {}\n", n.get<int64_t>(), cause);
  }
  return out;
}

}  // namespace gpuscope::report
