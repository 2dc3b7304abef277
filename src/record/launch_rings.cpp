#include "record/launch_rings.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"

namespace gpuscope::record {

LaunchRings::~LaunchRings() {
  for (auto& [pid, r] : rings_) release(r);
}

std::string LaunchRings::make_dir(const std::string& parent) {
  std::string tmpl = parent + "/gpuscope-launches-XXXXXX";
  if (!mkdtemp(tmpl.data()))
    throw Error("cannot make a directory for the launch rings under {}: {}", parent, std::strerror(errno));
  // The traced program may run as another user (record --user): it must be able to announce.
  chmod(tmpl.c_str(), 0733);
  return tmpl;
}

void LaunchRings::release(Ring& r) {
  if (r.owned && r.header) munmap(r.header, r.bytes);
  r.header = nullptr;
}

bool LaunchRings::adopt(pid_t pid, void* mapping, size_t bytes, bool owned) {
  auto* h = static_cast<gs_launch_ring_header*>(mapping);
  const bool whole = bytes >= sizeof(gs_launch_ring_header) && !std::memcmp(h->magic, GS_LAUNCH_RING_MAGIC, 8) &&
                     h->version == GS_LAUNCH_RING_VERSION && h->record_size == sizeof(gs_launch_record) &&
                     h->slots >= 1 && (h->slots & (h->slots - 1)) == 0 &&
                     bytes == sizeof(gs_launch_ring_header) + uint64_t(h->slots) * sizeof(gs_launch_record) &&
                     h->pid == uint32_t(pid);
  if (!whole) {
    if (owned) munmap(mapping, bytes);
    ++refused_;
    return false;
  }
  Ring r;
  r.header = h;
  r.bytes = bytes;
  r.owned = owned;
  r.read = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
  __atomic_store_n(&h->reader_pid, uint32_t(getpid()), __ATOMIC_RELEASE);
  if (auto old = rings_.find(pid); old != rings_.end()) {
    // A new process with a recycled pid, or the same one announced twice: the old ring goes.
    lost_gone_ += old->second.header ? __atomic_load_n(&old->second.header->lost, __ATOMIC_RELAXED) : 0;
    release(old->second);
    rings_.erase(old);
  }
  rings_.emplace(pid, std::move(r));
  return true;
}

void LaunchRings::discover() {
  DIR* d = opendir(dir_.c_str());
  if (!d) return;
  while (const dirent* e = readdir(d)) {
    int pid = 0;
    char rest = 0;
    if (std::sscanf(e->d_name, "launches-%d%c", &pid, &rest) != 1 || pid <= 0) continue;
    const std::string path = dir_ + "/" + e->d_name;
    auto known = rings_.find(pid);
    if (known != rings_.end() && known->second.announcement == path) continue;
    // "PID FD": the ring is the process's descriptor FD.
    const auto text = read_text_file(path);
    int said_pid = 0, fd = -1;
    if (!text || std::sscanf(text->c_str(), "%d %d", &said_pid, &fd) != 2 || said_pid != pid || fd < 0) {
      ++refused_;
      unlink(path.c_str());
      continue;
    }
    const std::string ring_path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    const int ring_fd = open(ring_path.c_str(), O_RDWR | O_CLOEXEC);
    struct stat st{};
    // Sealed against shrinking: the mapping can never run past the file (no SIGBUS here).
    const bool sealed = ring_fd >= 0 && (fcntl(ring_fd, F_GET_SEALS) & F_SEAL_SHRINK) && fstat(ring_fd, &st) == 0 &&
                        st.st_size > 0;
    void* mem = sealed ? mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0) : MAP_FAILED;
    if (ring_fd >= 0) close(ring_fd);
    if (mem == MAP_FAILED) {
      // Gone already (a short process), or not a ring of ours.
      ++refused_;
      unlink(path.c_str());
      continue;
    }
    if (adopt(pid, mem, size_t(st.st_size), true)) rings_[pid].announcement = path;
    else unlink(path.c_str());
  }
  closedir(d);
}

size_t LaunchRings::drain_one(pid_t pid, Ring& r, const OnLaunch& on) {
  if (!r.header) return 0;
  const auto* slots = reinterpret_cast<const gs_launch_record*>(r.header + 1);
  const uint64_t mask = uint64_t(r.header->slots) - 1;
  size_t n = 0;
  for (;; ++n) {
    const gs_launch_record& slot = slots[r.read & mask];
    if (__atomic_load_n(&slot.seq, __ATOMIC_ACQUIRE) != r.read + 1) break;
    gs_launch_record copy;
    std::memcpy(&copy, &slot, sizeof copy);
    ++r.read;
    on(uint32_t(pid), copy);
    // Free the slots now and then, not at every record: the writers read the tail at each launch.
    if ((n & 255) == 255) __atomic_store_n(&r.header->tail, r.read, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&r.header->tail, r.read, __ATOMIC_RELEASE);
  return n;
}

size_t LaunchRings::drain(const OnLaunch& on) {
  size_t n = 0;
  for (auto& [pid, r] : rings_) n += drain_one(pid, r, on);
  return n;
}

void LaunchRings::forget(pid_t pid, const OnLaunch& on) {
  auto it = rings_.find(pid);
  if (it == rings_.end()) return;
  drain_one(pid, it->second, on);
  lost_gone_ += __atomic_load_n(&it->second.header->lost, __ATOMIC_RELAXED);
  if (!it->second.announcement.empty()) unlink(it->second.announcement.c_str());
  release(it->second);
  rings_.erase(it);
}

uint64_t LaunchRings::lost() const {
  uint64_t n = lost_gone_;
  for (const auto& [pid, r] : rings_)
    if (r.header) n += __atomic_load_n(&r.header->lost, __ATOMIC_RELAXED);
  return n;
}

}  // namespace gpuscope::record
