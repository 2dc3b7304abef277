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
  maps_[pid] = std::move(maps);
  last_refresh_ns_[pid] = monotonic_ns();
  return true;
}

std::optional<ModuleAddress> ProcessMaps::lookup(pid_t pid, uint64_t addr) const {
  auto it = maps_.find(pid);
  if (it == maps_.end()) return std::nullopt;
  const auto& maps = it->second;
  auto m = std::upper_bound(maps.begin(), maps.end(), addr, [](uint64_t a, const auto& map) { return a < map.start; });
  if (m == maps.begin()) return std::nullopt;
  --m;
  if (addr >= m->end) return std::nullopt;
  auto& cached = open_paths_[pid][m->path];
  const uint64_t now = monotonic_ns();
  if (cached.first.empty() || now - cached.second > kOpenablePathTtlNs) cached = {openable_path(pid, m->path), now};
  return ModuleAddress{m->path, cached.first, addr - m->start + m->offset};
}

std::optional<ModuleAddress> ProcessMaps::resolve(pid_t pid, uint64_t addr) {
  {
    std::lock_guard lock(mu_);
    if (auto r = lookup(pid, addr)) return r;
    auto last = last_refresh_ns_.find(pid);
    const auto interval = miss_refresh_interval_ns_.find(pid);
    const uint64_t wait = interval == miss_refresh_interval_ns_.end() ? kMinRefreshIntervalNs : interval->second;
    if (last != last_refresh_ns_.end() && monotonic_ns() - last->second < wait) return std::nullopt;
  }
  if (!refresh(pid)) return std::nullopt;
  std::lock_guard lock(mu_);
  auto r = lookup(pid, addr);
  uint64_t& interval = miss_refresh_interval_ns_.try_emplace(pid, kMinRefreshIntervalNs).first->second;
  interval = r ? kMinRefreshIntervalNs : std::min(interval * 2, kMaxRefreshIntervalNs);
  return r;
}

std::vector<discover::Mapping> ProcessMaps::mappings(pid_t pid) {
  refresh(pid);
  std::lock_guard lock(mu_);
  auto it = maps_.find(pid);
  return it == maps_.end() ? std::vector<discover::Mapping>{} : it->second;
}

void ProcessMaps::forget_before(pid_t pid, uint64_t ts_ns) {
  std::lock_guard lock(mu_);
  auto it = last_refresh_ns_.find(pid);
  if (it == last_refresh_ns_.end() || it->second >= ts_ns) return;
  maps_.erase(pid);
  last_refresh_ns_.erase(it);
  miss_refresh_interval_ns_.erase(pid);
  open_paths_.erase(pid);
}

void ProcessMaps::forget(pid_t pid) {
  std::lock_guard lock(mu_);
  maps_.erase(pid);
  last_refresh_ns_.erase(pid);
  miss_refresh_interval_ns_.erase(pid);
  open_paths_.erase(pid);
}

}  // namespace gpuscope::symbolize
