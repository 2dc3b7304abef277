#include "symbolize/process_maps.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

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

// PROCMAP_QUERY (Linux 6.11; <linux/fs.h> of Debian 12 predates it): the mapping that covers an
// address, asked of the kernel without the text of every mapping.
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kProcmapFileBacked = 0x20;  // PROCMAP_QUERY_FILE_BACKED_VMA
std::atomic<bool> procmap_query_works{true};

enum class FileMapping { Yes, No, Unknown };

// Does a file now map addr in the process? Unknown where the kernel cannot say.
FileMapping file_maps(pid_t pid, uint64_t addr) {
  if (!procmap_query_works.load(std::memory_order_relaxed)) return FileMapping::Unknown;
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/maps").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileMapping::Unknown;
  char name[4096];
  ProcmapQuery q{};
  q.size = sizeof(q);
  q.query_flags = kProcmapFileBacked;
  q.query_addr = addr;
  q.vma_name_addr = reinterpret_cast<uintptr_t>(name);
  q.vma_name_size = sizeof(name);
  const int rc = ioctl(fd, kProcmapQuery, &q);
  const int err = errno;
  ::close(fd);
  // Only files with a path are kept in snapshots (not anon_inode:..., whose mappings are
  // file-backed too): another one would have every miss in it re-read the maps.
  if (rc == 0) return q.vma_name_size > 0 && name[0] == '/' ? FileMapping::Yes : FileMapping::No;
  if (err == ENOENT) return FileMapping::No;
  if (err == ENOTTY || err == EINVAL) procmap_query_works.store(false, std::memory_order_relaxed);
  return FileMapping::Unknown;
}

}  // namespace

std::string openable_path(pid_t pid, const std::string& path) {
  std::string in_root = discover::path_in_target(pid, path);
  return access(in_root.c_str(), R_OK) == 0 ? in_root : path;
}

std::string lasting_path(pid_t pid, const discover::Mapping& m) {
  struct stat st {};
  if (m.inode && ::stat(m.path.c_str(), &st) == 0 && st.st_ino == m.inode && major(st.st_dev) == m.dev_major &&
      minor(st.st_dev) == m.dev_minor)
    return m.path;
  return openable_path(pid, m.path);
}

bool ProcessMaps::refresh(pid_t pid) {
  reads_.fetch_add(1, std::memory_order_relaxed);
  auto maps = discover::read_maps(pid);
  if (maps.empty()) return false;
  std::erase_if(maps, [](const discover::Mapping& m) { return m.path.empty() || m.path[0] != '/'; });
  std::sort(maps.begin(), maps.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  // Read while the process was exiting, the list may be a part of what it mapped (its memory
  // was being torn down): a short-lived program's frames in the C library went unnamed once such
  // a read replaced the snapshot. The snapshot before stays.
  const bool exiting = discover::process_exiting(pid);
  std::lock_guard lock(mu_);
  if (exiting)
    if (auto it = processes_.find(pid); it != processes_.end() && !it->second.maps.empty()) return true;
  Process& p = processes_[pid];
  p.maps = std::move(maps);
  p.no_file_pages.clear();
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
  }
  // A miss: is the address in a file mapped since the snapshot? Asked of the kernel for that
  // one address where it can answer, the maps are re-read only when one is; else backing off.
  const uint64_t page = addr >> 12;
  {
    std::lock_guard lock(mu_);
    if (auto it = processes_.find(pid); it != processes_.end() && it->second.no_file_pages.contains(page))
      return std::nullopt;
  }
  const FileMapping mapped = file_maps(pid, addr);
  if (mapped == FileMapping::No) {
    std::lock_guard lock(mu_);
    if (auto it = processes_.find(pid); it != processes_.end()) {
      auto& pages = it->second.no_file_pages;
      if (pages.size() >= kMaxNoFilePages) pages.clear();
      pages.insert(page);
    }
    return std::nullopt;
  }
  {
    std::lock_guard lock(mu_);
    if (auto it = processes_.find(pid); it != processes_.end()) {
      // The kernel says a file maps it: the snapshot is older than that mapping (taken at a
      // library's load while the loader was still mapping its segments), so it is read again at
      // once, unless it was read for this very page a moment ago (a mapping the snapshot leaves out).
      auto& st = it->second;
      const bool again = mapped == FileMapping::Yes && st.yes_refresh_page != page;
      const uint64_t wait = mapped == FileMapping::Yes ? kMinRefreshIntervalNs
                                                       : std::max(st.miss_refresh_interval_ns, kMinRefreshIntervalNs);
      if (!again && monotonic_ns() - st.refreshed_ns < wait) return std::nullopt;
      if (mapped == FileMapping::Yes) st.yes_refresh_page = page;
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
