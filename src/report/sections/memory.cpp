#include "report/sections/sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/functions.h"
#include "report/format.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

constexpr size_t kStackFrames = 8;  // frames shown per leak
constexpr int64_t kSeriesPoints = 50;  // points in each process's device memory series

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

}  // namespace

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

}  // namespace gpuscope::report
