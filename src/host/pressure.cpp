#include "host/pressure.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "common/files.h"
#include "common/thread_name.h"

namespace gpuscope::host {
namespace {

// The value of `key` in a "key value" per line file (memory.stat, /proc/vmstat).
std::optional<uint64_t> stat_value(const std::optional<std::string>& text, std::string_view key) {
  if (!text) return std::nullopt;
  std::istringstream lines(*text);
  std::string k;
  uint64_t v = 0;
  while (lines >> k >> v)
    if (k == key) return v;
  return std::nullopt;
}

void read_tcp(const std::string& path, PressureReading& r) {
  if (const auto text = read_text_file(path))
    if (const auto segs = parse_tcp_segments(*text)) std::tie(r.tcp_out_segs, r.tcp_retrans_segs) = *segs;
}

void read_pressure(const std::string& path, std::optional<uint64_t>& some, std::optional<uint64_t>* full) {
  const auto text = read_text_file(path);
  if (!text) return;
  auto [s, f] = parse_pressure(*text);
  some = s;
  if (full) *full = f;
}

}  // namespace

std::pair<std::optional<uint64_t>, std::optional<uint64_t>> parse_pressure(const std::string& text) {
  std::pair<std::optional<uint64_t>, std::optional<uint64_t>> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find("total=");
    if (at == std::string::npos) continue;
    uint64_t v = 0;
    try {
      v = std::stoull(line.substr(at + 6));
    } catch (const std::exception&) {
      continue;
    }
    if (line.starts_with("some")) out.first = v;
    if (line.starts_with("full")) out.second = v;
  }
  return out;
}

std::optional<std::pair<uint64_t, uint64_t>> parse_tcp_segments(const std::string& text) {
  // Two "Tcp:" lines: the names, then the values.
  std::istringstream lines(text);
  std::vector<std::string> names;
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("Tcp:")) continue;
    std::istringstream f(line.substr(4));
    std::vector<std::string> words;
    for (std::string w; f >> w;) words.push_back(w);
    if (names.empty()) {
      names = std::move(words);
      continue;
    }
    std::optional<uint64_t> out, retrans;
    for (size_t i = 0; i < names.size() && i < words.size(); ++i) {
      if (names[i] != "OutSegs" && names[i] != "RetransSegs") continue;
      try {
        (names[i] == "OutSegs" ? out : retrans) = std::stoull(words[i]);
      } catch (const std::exception&) {
      }
    }
    if (out && retrans) return std::pair{*out, *retrans};
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<std::pair<std::string, bool>> parse_cgroup(const std::string& text, bool unified) {
  std::istringstream lines(text);
  std::optional<std::pair<std::string, bool>> v1;
  for (std::string line; std::getline(lines, line);) {
    // "hierarchy-ID:controller-list:path"
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.substr(0, a) == "0" && controllers.empty()) {
      if (unified) return std::pair{path, true};
      continue;
    }
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "cpu") v1 = std::pair{path, false};
  }
  return v1;
}

bool PressureSampler::available() { return read_text_file("/proc/pressure/cpu").has_value(); }

void PressureSampler::watch(pid_t pid, bool on) {
  std::lock_guard lock(mu_);
  const auto it = std::find(pids_.begin(), pids_.end(), pid);
  if (on && it == pids_.end() && pids_.size() < 1024) pids_.push_back(pid);
  if (!on && it != pids_.end()) {
    pids_.erase(it);
    cgroups_.erase(pid);
  }
}

std::vector<PressureReading> PressureSampler::sample_once() {
  std::vector<PressureReading> out;
  const uint64_t now = monotonic_ns();
  PressureReading h;
  h.ts_ns = now;
  read_pressure("/proc/pressure/cpu", h.cpu_some_us, nullptr);
  read_pressure("/proc/pressure/memory", h.memory_some_us, &h.memory_full_us);
  read_pressure("/proc/pressure/io", h.io_some_us, &h.io_full_us);
  h.refault_file = stat_value(read_text_file("/proc/vmstat"), "workingset_refault_file");
  read_tcp("/proc/net/snmp", h);
  if (h.cpu_some_us || h.memory_some_us || h.io_some_us) out.push_back(h);

  std::vector<std::pair<pid_t, std::pair<std::string, bool>>> todo;
  {
    std::lock_guard lock(mu_);
    for (pid_t pid : pids_) {
      auto it = cgroups_.find(pid);
      if (it == cgroups_.end()) {
        const auto text = read_text_file(fmt::format("/proc/{}/cgroup", pid));
        static const bool unified = read_text_file("/sys/fs/cgroup/cgroup.controllers").has_value();
        const auto cg = text ? parse_cgroup(*text, unified) : std::nullopt;
        if (!cg) continue;
        it = cgroups_.emplace(pid, *cg).first;
      }
      todo.emplace_back(pid, it->second);
    }
  }
  std::set<std::string> done;
  for (const auto& [pid, cg] : todo) {
    const auto& [path, v2] = cg;
    if (path == "/" || !done.insert(path).second) continue;  // the root: the host's, above
    PressureReading r;
    r.ts_ns = now;
    r.pid = uint32_t(pid);
    r.cgroup = path;
    read_tcp(fmt::format("/proc/{}/net/snmp", pid), r);  // its network namespace's
    const std::string dir = v2 ? "/sys/fs/cgroup" + path : "";
    std::optional<std::string> stat;
    if (v2) {
      read_pressure(dir + "/cpu.pressure", r.cpu_some_us, nullptr);
      read_pressure(dir + "/memory.pressure", r.memory_some_us, &r.memory_full_us);
      read_pressure(dir + "/io.pressure", r.io_some_us, &r.io_full_us);
      stat = read_text_file(dir + "/cpu.stat");
      r.refault_file = stat_value(read_text_file(dir + "/memory.stat"), "workingset_refault_file");
    } else {
      r.refault_file =
          stat_value(read_text_file("/sys/fs/cgroup/memory" + path + "/memory.stat"), "workingset_refault_file");
      for (const char* mount : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"})
        if ((stat = read_text_file(mount + path + "/cpu.stat"))) break;
    }
    if (stat) {
      std::istringstream lines(*stat);
      std::string key;
      uint64_t v = 0;
      while (lines >> key >> v) {
        if (key == "nr_periods") r.periods = v;
        if (key == "nr_throttled") r.throttled_periods = v;
        if (key == "throttled_usec") r.throttled_us = v;
        if (key == "throttled_time") r.throttled_us = v / 1000;  // v1: ns
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

void PressureSampler::start(double hz, Sink sink) {
  if (hz <= 0 || thread_.joinable()) return;
  stop_.reset();
  thread_ = std::thread([this, hz, sink = std::move(sink)] {
    name_this_thread("gs-pressure");
    const auto period = std::chrono::nanoseconds(int64_t(1e9 / hz));
    auto next = std::chrono::steady_clock::now();
    do {
      auto batch = sample_once();
      if (!batch.empty()) sink(std::move(batch));
      next += period;
      if (next < std::chrono::steady_clock::now()) next = std::chrono::steady_clock::now();
    } while (stop_.sleep_until(next));
  });
}

void PressureSampler::stop() {
  stop_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpuscope::host
