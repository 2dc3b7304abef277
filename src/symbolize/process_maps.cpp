#include "symbolize/process_maps.h"

#include <unistd.h>

#include <algorithm>

#include "common/clock.h"

namespace gpuscope::symbolize {
namespace {

// Addresses outside any file (JIT code, a process already gone, a frame-pointer walk gone
// astray in code built without them) would otherwise make every lookup re-read /proc, which
// for a PyTorch process is thousands of lines: a miss re-reads the maps at most this often,
// the interval doubling while re-reading does not find the address and reset once it does.
constexpr uint64_t kMinRefreshIntervalNs = 20'000'000;
constexpr uint64_t kMaxRefreshIntervalNs = 2'000'000'000;
// How long openable_path's answer for a (process, file) is reused: it changes only when the
// process exits (its root goes), and asking costs a path walk in the kernel per frame.
constexpr uint64_t kOpenablePathTtlNs = 1'000'000'000;

}  // namespace

std::string openable_path(pid_t pid, const std::string& path) {
  std::string in_root = discover::path_in_target(pid, path);
  return access(in_root.c_str(), R_OK) == 0 ? in_root : path;
}

bool ProcessMaps::refresh(pid_t pid) {
  auto maps = discover::read_maps(pid);
  if (maps.empty()) return false;
  std::erase_if(maps, [](const discover::Mapping& m) { return m.path.empty() || m.path[0] != '/'; });
  std::sort(maps.begin(), maps.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  std::lock_guard lock(mu_);
  Process& p = processes_[pid];
  p.maps = std::move(maps);
  p.refreshed_ns = monotonic_ns();
  return true;
}

std::optional<ModuleAddress> ProcessMaps::lookup(pid_t pid, uint64_t addr) {
  auto it = processes_.find(pid);
  if (it == processes_.end()) return std::nullopt;
  const auto& maps = it->second.maps;
  auto m = std::upper_bound(maps.begin(), maps.end(), addr, [](uint64_t a, const auto& map) { return a < map.start; });
  if (m == maps.begin()) return std::nullopt;
  --m;
  if (addr >= m->end) return std::nullopt;
  auto& cached = it->second.open_paths[m->path];
  const uint64_t now = monotonic_ns();
  if (cached.first.empty() || now - cached.second > kOpenablePathTtlNs) cached = {openable_path(pid, m->path), now};
  return ModuleAddress{m->path, cached.first, addr - m->start + m->offset};
}

std::optional<ModuleAddress> ProcessMaps::resolve(pid_t pid, uint64_t addr) {
  {
    std::lock_guard lock(mu_);
    if (auto r = lookup(pid, addr)) return r;
    if (auto it = processes_.find(pid); it != processes_.end()) {
      const uint64_t wait = std::max(it->second.miss_refresh_interval_ns, kMinRefreshIntervalNs);
      if (monotonic_ns() - it->second.refreshed_ns < wait) return std::nullopt;
    }
  }
  if (!refresh(pid)) return std::nullopt;
  std::lock_guard lock(mu_);
  auto r = lookup(pid, addr);
  uint64_t& interval = processes_[pid].miss_refresh_interval_ns;
  interval = r ? kMinRefreshIntervalNs : std::min(std::max(interval, kMinRefreshIntervalNs) * 2, kMaxRefreshIntervalNs);
  return r;
}

std::vector<discover::Mapping> ProcessMaps::mappings(pid_t pid) {
  refresh(pid);
  std::lock_guard lock(mu_);
  auto it = processes_.find(pid);
  return it == processes_.end() ? std::vector<discover::Mapping>{} : it->second.maps;
}

void ProcessMaps::forget_before(pid_t pid, uint64_t ts_ns) {
  std::lock_guard lock(mu_);
  auto it = processes_.find(pid);
  if (it == processes_.end() || it->second.refreshed_ns >= ts_ns) return;
  processes_.erase(it);
}

void ProcessMaps::forget(pid_t pid) {
  std::lock_guard lock(mu_);
  processes_.erase(pid);
}

}  // namespace gpuscope::symbolize
