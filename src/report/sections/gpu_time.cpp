#include "report/sections/gpu_time.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "report/format.h"
#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

constexpr int64_t kSeriesPoints = 50;  // busy share over the span in use, in this many parts
constexpr size_t kGaps = 5;            // longest idle gaps shown per GPU

struct Activity {
  int64_t start, end, pid, stack, tid;
};

int64_t busy_ns(const std::vector<Interval>& busy) {
  int64_t ns = 0;
  for (const auto& b : busy) ns += b.end - b.start;
  return ns;
}

// Share of each of kSeriesPoints equal parts of [first, last) that the GPU was busy.
json busy_series(const std::vector<Interval>& busy, int64_t first, int64_t last) {
  std::vector<int64_t> bucket(kSeriesPoints, 0);
  const int64_t width = std::max<int64_t>((last - first) / kSeriesPoints, 1);
  for (const auto& [s, e] : busy)
    for (int64_t t = s; t < e;) {
      const int64_t b = std::clamp<int64_t>((t - first) / width, 0, kSeriesPoints - 1);
      const int64_t upto = b == kSeriesPoints - 1 ? e : std::min(e, first + (b + 1) * width);
      bucket[size_t(b)] += upto - t;
      t = std::max(upto, t + 1);
    }
  json series = json::array();
  // The last part also holds what integer division left over.
  for (int64_t b = 0; b < kSeriesPoints; ++b) {
    const int64_t w = b == kSeriesPoints - 1 ? std::max<int64_t>(last - first - b * width, width) : width;
    series.push_back(std::min(1.0, double(bucket[size_t(b)]) / double(w)));
  }
  return series;
}

// One process's use of one GPU.
json process_span(int64_t pid, const std::string& comm, const std::vector<Interval>& acts, int64_t origin) {
  const auto busy = busy_stretches(acts);
  const int64_t span = busy.back().end - busy.front().start, ns = busy_ns(busy);
  return {{"pid", pid},
          {"comm", comm},
          {"activities", acts.size()},
          {"busy_ns", ns},
          {"first_ns", busy.front().start - origin},
          {"last_ns", busy.back().end - origin},
          {"active_span_ns", span},
          {"busy_share", span > 0 ? double(ns) / double(span) : 1.0}};
}

// What the threads that feed the GPU were doing during an idle gap: their calls under way then,
// and where their CPU samples fell.
json gap_json(const GpuTimeScope& s, CallSites& sites, const std::string& tids, int64_t g0, int64_t g1) {
  json doing = json::array();
  if (!tids.empty()) {
    // Calls of the feeding threads that were under way during the gap, longest overlap first.
    auto c = s.db.prepare(fmt::format(
        "SELECT f.name, min(c.ts_ns + coalesce(c.duration_ns, 0), ?2) - max(c.ts_ns, ?1) AS overlap, "
        "coalesce(c.stack_id, 0) FROM calls c JOIN functions f ON f.id = c.func WHERE c.tid IN ({}) "
        "AND c.ts_ns < ?2 AND c.ts_ns + coalesce(c.duration_ns, 0) > ?1 ORDER BY overlap DESC LIMIT 3",
        tids));
    c.bind(1, g0).bind(2, g1);
    while (c.step()) {
      json d{{"call", c.str(0)}, {"overlap_ns", c.i64(1)}, {"site", sites.site(c.i64(2))}};
      if (auto py = sites.python_site(c.i64(2)); !py.empty()) d["python"] = py;
      doing.push_back(std::move(d));
    }
  }
  json sampled = json::array();
  if (!tids.empty() && s.db.has_table("samples")) {
    std::map<std::string, int64_t> where;
    auto q = s.db.prepare(
        fmt::format("SELECT coalesce(stack_id, 0) FROM samples WHERE tid IN ({}) AND ts_ns BETWEEN ?1 AND ?2", tids));
    q.bind(1, g0).bind(2, g1);
    while (q.step()) {
      const auto& fs = sites.frames(q.i64(0));
      const std::string py = sites.python_site(q.i64(0));
      where[py.empty() ? (fs.empty() ? "[no stack]" : fs.front().text) : py] += 1;
    }
    for (const auto& [w, n] : by_count(where, 3)) sampled.push_back({{"where", w}, {"samples", n}});
  }
  return {{"start_ns", g0 - s.origin}, {"duration_ns", g1 - g0}, {"calls", doing}, {"cpu_samples", sampled}};
}

json gpu_json(const GpuTimeScope& s, CallSites& sites, int64_t gpu, const std::vector<Activity>& acts,
              const std::map<int64_t, std::string>& comms) {
  std::vector<Interval> intervals;
  std::map<int64_t, std::vector<Interval>> by_pid;
  std::set<int64_t> feeders;
  for (const auto& a : acts) {
    intervals.push_back({a.start, a.end});
    by_pid[a.pid].push_back({a.start, a.end});
    if (a.tid) feeders.insert(a.tid);
  }
  const auto busy = busy_stretches(std::move(intervals));
  const int64_t first = busy.front().start, last = busy.back().end, span = last - first, ns = busy_ns(busy);

  // Gaps: between consecutive busy stretches, so none before the first or after the last.
  std::vector<Interval> gaps;
  for (size_t i = 1; i < busy.size(); ++i) gaps.push_back({busy[i - 1].end, busy[i].start});
  std::stable_sort(gaps.begin(), gaps.end(),
                   [](const auto& a, const auto& b) { return a.end - a.start > b.end - b.start; });
  if (gaps.size() > kGaps) gaps.resize(kGaps);
  std::string tids;
  for (int64_t t : feeders) tids += (tids.empty() ? "" : ",") + std::to_string(t);
  json gj = json::array();
  for (const auto& g : gaps) gj.push_back(gap_json(s, sites, tids, g.start, g.end));

  json procs = json::array();
  for (const auto& [pid, pa] : by_pid) {
    auto c = comms.find(pid);
    procs.push_back(process_span(pid, c == comms.end() ? "" : c->second, pa, s.origin));
  }
  std::stable_sort(procs.begin(), procs.end(), [](const json& a, const json& b) {
    return a["first_ns"].get<int64_t>() < b["first_ns"].get<int64_t>();
  });

  return {{"gpu", gpu},
          {"activities", acts.size()},
          {"busy_ns", ns},
          // Over the span in use; busy_share_of_recording over the whole recording.
          {"busy_share", span > 0 ? double(ns) / double(span) : 1.0},
          {"busy_share_of_recording", double(ns) / double(std::max<int64_t>(s.end - s.origin, 1))},
          {"first_ns", first - s.origin},
          {"last_ns", last - s.origin},
          {"active_span_ns", span},
          {"startup_ns", std::max<int64_t>(first - s.origin, 0)},
          {"startup_from", s.command_mode ? "command start" : "recording start"},
          {"after_last_ns", std::max<int64_t>(s.end - last, 0)},
          {"series", busy_series(busy, first, last)},
          {"processes", procs},
          {"longest_gaps", gj}};
}

}  // namespace

std::vector<Interval> busy_stretches(std::vector<Interval> intervals) {
  std::stable_sort(intervals.begin(), intervals.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  std::vector<Interval> busy;
  for (const auto& a : intervals) {
    if (!busy.empty() && a.start <= busy.back().end)
      busy.back().end = std::max(busy.back().end, a.end);
    else
      busy.push_back(a);
  }
  return busy;
}

json gpu_time(const GpuTimeScope& s, CallSites& sites, size_t top) {
  if (!s.db.has_table("gpu_activities")) return nullptr;
  std::map<int64_t, std::vector<Activity>> by_gpu;
  struct KernelTotal {
    int64_t count = 0, ns = 0, max_ns = 0;
    std::map<int64_t, int64_t> ns_by_stack;
  };
  std::map<std::string, KernelTotal> kernels;
  auto q = s.db.prepare(
      "SELECT coalesce(a.gpu, 0), a.start_ns, a.end_ns, a.kind, coalesce(a.name, ''), coalesce(c.stack_id, 0), "
      "coalesce(c.tid, 0), CASE WHEN c.id IS NULL THEN 1 ELSE " + s.stack_weight +
      " END, a.pid FROM gpu_activities a LEFT JOIN calls c ON c.id = a.call_id ORDER BY a.start_ns");
  while (q.step()) {
    const int64_t start = q.i64(1), end = std::max(q.i64(2), q.i64(1));
    by_gpu[q.i64(0)].push_back({start, end, q.i64(8), q.i64(5), q.i64(6)});
    if (q.str(3) != "kernel") continue;
    auto& k = kernels[q.str(4).empty() ? "[unnamed kernel]" : q.str(4)];
    ++k.count;
    k.ns += end - start;
    k.max_ns = std::max(k.max_ns, end - start);
    if (const int64_t w = q.i64(7); w > 0) k.ns_by_stack[q.i64(5)] += (end - start) * w;
  }
  if (by_gpu.empty()) return nullptr;

  std::map<int64_t, std::string> comms;
  for (auto p = s.db.prepare("SELECT pid, comm FROM processes"); p.step();) comms[p.i64(0)] = p.str(1);
  json gpus = json::array();
  for (const auto& [gpu, acts] : by_gpu) gpus.push_back(gpu_json(s, sites, gpu, acts, comms));

  std::map<std::string, int64_t> ns;
  int64_t all_ns = 0;
  for (const auto& [name, k] : kernels) {
    ns[name] = k.ns;
    all_ns += k.ns;
  }
  json tk = json::array();
  for (const auto& [name, total] : by_count(ns, top)) {
    const auto& k = kernels.at(name);
    // The launch site that took most of the kernel's time (none when no launch's stack was taken).
    auto site = std::max_element(k.ns_by_stack.begin(), k.ns_by_stack.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    const int64_t stack = site == k.ns_by_stack.end() ? 0 : site->first;
    json j{{"name", name},
           {"launches", k.count},
           {"gpu_ns", total},
           {"share", double(total) / std::max<int64_t>(all_ns, 1)},
           {"mean_ns", total / std::max<int64_t>(k.count, 1)},
           {"max_ns", k.max_ns},
           {"site", sites.site(stack)}};
    if (auto py = sites.python_site(stack); !py.empty()) j["python"] = py;
    tk.push_back(std::move(j));
  }
  return {{"gpus", gpus}, {"kernel_ns", all_ns}, {"top_kernels", tk}};
}

void gpu_time_text(std::string& out, const json& g) {
  if (g.is_null()) return;  // recorded without --gpu-times
  heading(out, fmt::format("GPU time (CUPTI): {} in kernels", time_text(i64(g, "kernel_ns"))));
  static constexpr std::string_view kBars[] = {" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  auto share = [](const json& j) { return fmt::format("{:.1f}%", 100 * j.at("busy_share").get<double>()); };
  for (const auto& d : g.at("gpus")) {
    const int64_t span = i64(d, "active_span_ns");
    out += fmt::format("  GPU {}: busy {} of the {} it was in use ({}), {} activities\n", i64(d, "gpu"),
                       time_text(i64(d, "busy_ns")), time_text(span), share(d), num(i64(d, "activities")));
    out += fmt::format("    in use from {} to {} of the recording: its first kernel, copy or memset to its last\n",
                       time_text(i64(d, "first_ns")), time_text(i64(d, "last_ns")));
    out += fmt::format("    start-up: {} from the {} to the first; {} after the last to the recording's end\n",
                       time_text(i64(d, "startup_ns")),
                       str(d, "startup_from") == "command start" ? "command's start" : "recording's start",
                       time_text(i64(d, "after_last_ns")));
    std::string line;
    for (const auto& v : d.at("series")) line += kBars[size_t(std::lround(v.get<double>() * 8))];
    out += fmt::format("    busy over time in use |{}|\n", line);
    const auto& procs = d.at("processes");
    if (procs.size() > 1) {
      out += "    processes on it, each over its own span in use:\n";
      for (const auto& p : procs)
        out += fmt::format("      PID {}{}: busy {} of {} ({}), from {} to {}, {} activities\n", i64(p, "pid"),
                           str(p, "comm").empty() ? "" : " " + str(p, "comm"), time_text(i64(p, "busy_ns")),
                           time_text(i64(p, "active_span_ns")), share(p), time_text(i64(p, "first_ns")),
                           time_text(i64(p, "last_ns")), num(i64(p, "activities")));
    }
    const auto& gaps = d.at("longest_gaps");
    if (gaps.empty()) continue;
    out += "    longest idle gaps in use, and what the threads that feed this GPU did meanwhile:\n";
    for (const auto& gap : gaps) {
      out += fmt::format("      {} idle from {}\n", time_text(i64(gap, "duration_ns")), time_text(i64(gap, "start_ns")));
      for (const auto& c : gap.at("calls"))
        out += fmt::format("        in {} for {}, from {}\n", str(c, "call"), time_text(i64(c, "overlap_ns")),
                           site_text(c, 90));
      for (const auto& sm : gap.at("cpu_samples"))
        out += fmt::format("        on CPU in {} ({} samples)\n", shorten(str(sm, "where"), 100), num(i64(sm, "samples")));
      if (gap.at("calls").empty() && gap.at("cpu_samples").empty())
        out += "        no call under way and no CPU sample (record with --cpu-profile to see the CPU side)\n";
    }
  }
  Table t({">GPU TIME", ">SHARE", ">LAUNCHES", ">MEAN", "KERNEL"});
  for (const auto& k : g.at("top_kernels")) {
    t.add({time_text(i64(k, "gpu_ns")), fmt::format("{:.1f}%", 100 * k.at("share").get<double>()), num(i64(k, "launches")),
           time_text(i64(k, "mean_ns")), shorten(str(k, "name"), 100)});
    t.add({"", "", "", "", "  from " + site_text(k, 100)});
  }
  out += t.render();
}

}  // namespace gpuscope::report
