#include "record/launch_rings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "cuda/functions.h"
#include "decode/decoder.h"

namespace gpuscope::record {

LaunchRings::LaunchRings(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;  // tests: rings adopted, none received
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = dir_ + "/" GS_LAUNCH_RING_SOCKET;
  if (path.size() >= sizeof addr.sun_path)
    throw Error("the launch rings' socket path {} is too long for a socket: set TMPDIR to a shorter directory", path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  socket_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int on = 1;
  if (socket_ < 0 || setsockopt(socket_, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0 ||
      bind(socket_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw Error("cannot make the launch rings' socket {}: {}", path, std::strerror(errno));
  // A program that dropped privileges may send to it; the directory is not listable by others.
  chmod(path.c_str(), 0666);
}

LaunchRings::~LaunchRings() {
  for (auto& [pid, r] : rings_) release(r);
  for (auto& [pid, r] : retired_) release(r);
  if (socket_ >= 0) close(socket_);
}

std::string LaunchRings::make_dir(const std::string& parent) {
  std::string tmpl = parent + "/gpuscope-launches-XXXXXX";
  if (!mkdtemp(tmpl.data()))
    throw Error("cannot make a directory for the launch rings under {}: {}", parent, std::strerror(errno));
  // The traced program may drop privileges: it must be able to reach the socket.
  chmod(tmpl.c_str(), 0733);
  return tmpl;
}

void LaunchRings::release(Ring& r) {
  if (r.header) let_go(r);
  if (r.owned && r.header) munmap(r.header, r.bytes);
  r.header = nullptr;
}

void LaunchRings::let_go(Ring& r) {
  if (!r.claimed) return;
  r.claimed = false;
  // Paused first: a launch that saw it running may still be written after this (the next
  // claimer reads only what comes after its own claim).
  __atomic_store_n(&r.header->paused, 1u, __ATOMIC_RELEASE);
  uint32_t mine = uint32_t(getpid());
  __atomic_compare_exchange_n(&r.header->reader_pid, &mine, 0u, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

const discover::Mapping* LaunchRings::standby_ring(const std::vector<discover::Mapping>& maps) {
  // Its memfd's mapping: "/memfd:gpuscope-launches (deleted)".
  const std::string name = "/memfd:" GS_LAUNCH_RING_MEMFD;
  for (const auto& m : maps)
    if (m.path == name || m.path == name + " (deleted)") return &m;
  return nullptr;
}

LaunchRings::Claim LaunchRings::claim(pid_t pid, const std::vector<discover::Mapping>& maps, uint32_t* reader) {
  const discover::Mapping* ring = standby_ring(maps);
  if (!ring) return Claim::NoRing;
  // The memfd itself (needs CAP_SYS_ADMIN, as gpuscope has): sealed, so the mapping can never
  // run past the file.
  const int fd = open(fmt::format("/proc/{}/map_files/{:x}-{:x}", pid, ring->start, ring->end).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Claim::Refused;
  struct stat st{};
  const bool sealed = (fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) && fstat(fd, &st) == 0 &&
                      st.st_size >= off_t(sizeof(gs_launch_ring_header));
  void* mem = sealed ? mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (mem == MAP_FAILED) return Claim::Refused;
  auto* h = static_cast<gs_launch_ring_header*>(mem);
  // Claimed by setting reader_pid: from 0, or from a gpuscope that is gone (its pid free, or
  // taken by another program since).
  const uint32_t me = uint32_t(getpid());
  uint32_t had = 0;
  while (!__atomic_compare_exchange_n(&h->reader_pid, &had, me, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    if (had == me) break;
    const auto comm = read_text_file(fmt::format("/proc/{}/comm", had));
    if (comm && comm->starts_with("gpuscope")) {
      munmap(mem, size_t(st.st_size));
      if (reader) *reader = had;
      return Claim::Taken;
    }
  }
  std::lock_guard lock(mu_);
  const uint64_t since = monotonic_ns();
  Ring* r = adopt_locked(pid, mem, size_t(st.st_size), true);
  if (!r) {
    uint32_t mine = me;
    __atomic_compare_exchange_n(&h->reader_pid, &mine, 0u, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    return Claim::Refused;  // unmapped already
  }
  r->claimed = true;
  r->since_ns = since;
  r->lost_before = __atomic_load_n(&h->lost, __ATOMIC_RELAXED);
  // No launch is handed over for its stack until the caller has probed this process's hooks
  // and set N (set_stack_every): it would be lost.
  __atomic_store_n(&h->stack_every, 0u, __ATOMIC_RELAXED);
  __atomic_store_n(&h->paused, 0u, __ATOMIC_RELEASE);
  return Claim::Claimed;
}

bool LaunchRings::adopt(pid_t pid, void* mapping, size_t bytes, bool owned) {
  std::lock_guard lock(mu_);
  return adopt_locked(pid, mapping, bytes, owned) != nullptr;
}

LaunchRings::Ring* LaunchRings::adopt_locked(pid_t pid, void* mapping, size_t bytes, bool owned) {
  auto* h = static_cast<gs_launch_ring_header*>(mapping);
  // Read once: the process can write its header at any time, and only what was checked is used.
  const uint32_t slots = bytes >= sizeof(gs_launch_ring_header) ? __atomic_load_n(&h->slots, __ATOMIC_RELAXED) : 0;
  const bool whole = bytes >= sizeof(gs_launch_ring_header) && !std::memcmp(h->magic, GS_LAUNCH_RING_MAGIC, 8) &&
                     h->version == GS_LAUNCH_RING_VERSION && h->record_size == sizeof(gs_launch_record) &&
                     slots >= 1 && (slots & (slots - 1)) == 0 && h->pid == uint32_t(pid);
  const uint64_t names_at = whole ? __atomic_load_n(&h->names_offset, __ATOMIC_RELAXED) : 0;
  const uint64_t names_bytes = whole ? __atomic_load_n(&h->names_bytes, __ATOMIC_RELAXED) : 0;
  const bool laid_out = names_at == sizeof(gs_launch_ring_header) + uint64_t(slots) * sizeof(gs_launch_record) &&
                        names_bytes % 8 == 0 && bytes == names_at + names_bytes;
  const uint32_t clock = whole ? __atomic_load_n(&h->clock, __ATOMIC_RELAXED) : 0;
  if (!whole || !laid_out || (clock != GS_LAUNCH_CLOCK_MONOTONIC && clock != GS_LAUNCH_CLOCK_TSC)) {
    if (owned) munmap(mapping, bytes);
    ++refused_;
    return nullptr;
  }
  Ring r;
  r.header = h;
  r.bytes = bytes;
  r.owned = owned;
  r.mask = uint64_t(slots) - 1;
  r.clock = clock;
  r.names_at = names_at;
  r.names_bytes = names_bytes;
  r.read = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
  __atomic_store_n(&h->stack_every, initial_stack_every_.load(), __ATOMIC_RELAXED);
  __atomic_store_n(&h->reader_pid, uint32_t(getpid()), __ATOMIC_RELEASE);
  if (auto old = rings_.find(pid); old != rings_.end()) {
    // The process exec'd (or its pid was reused): the old image's ring is read once more, then goes.
    retired_.emplace_back(pid, old->second);
    rings_.erase(old);
  }
  Ring& added = rings_.emplace(pid, std::move(r)).first->second;
  if (received_.size() < 1'000'000) received_.insert(pid);
  return &added;
}

void LaunchRings::receive() {
  for (;;) {
    gs_launch_ring_hello hello{};
    iovec iov{&hello, sizeof hello};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4) + CMSG_SPACE(sizeof(ucred))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(socket_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return;  // none waiting (or the socket failed: nothing more comes)
    int fd = -1;
    pid_t sender = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS) {
        // Only the first is a ring: any more were sent in error, and are closed.
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int one;
          std::memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof one);
          if (fd < 0) fd = one;
          else close(one);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        sender = cred.pid;
      }
    }
    if (fd < 0) {
      ++refused_;
      continue;
    }
    // Sealed against shrinking: the mapping can never run past the file (no SIGBUS here). The
    // kernel's word for who sent it, not the message's.
    struct stat st{};
    const bool sealed = n == ssize_t(sizeof hello) && sender > 0 && hello.pid == uint32_t(sender) &&
                        (fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) && fstat(fd, &st) == 0 && st.st_size > 0;
    void* mem = sealed ? mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (mem == MAP_FAILED) {
      ++refused_;
      continue;
    }
    adopt(sender, mem, size_t(st.st_size), true);
  }
}

void LaunchRings::discover() {
  if (socket_ >= 0) receive();
}

void LaunchRings::read_names(pid_t pid, Ring& r) {
  if (r.names_broken) return;
  const char* area = reinterpret_cast<const char*>(r.header) + r.names_at;
  const uint64_t reserved = std::min<uint64_t>(__atomic_load_n(&r.header->names_head, __ATOMIC_ACQUIRE), r.names_bytes);
  while (r.names_read + sizeof(gs_launch_name) <= reserved) {
    const auto* e = reinterpret_cast<const gs_launch_name*>(area + r.names_read);
    if (__atomic_load_n(&e->ready, __ATOMIC_ACQUIRE) != 1) return;  // being written
    const uint32_t length = e->length;
    const uint64_t size = GS_LAUNCH_NAME_SIZE(uint64_t(length));
    if (length > GS_LAUNCH_NAME_MAX || r.names_read + size > r.names_bytes) {
      r.names_broken = true;
      return;
    }
    const uint64_t function = e->function;
    std::string name(e->name, strnlen(e->name, length));
    r.names_read += size;
    names_.fetch_add(1, std::memory_order_relaxed);
    if (on_name_ && !name.empty()) on_name_(uint32_t(pid), function, name);
  }
}

size_t LaunchRings::drain_one(pid_t pid, Ring& r, const OnLaunch& on, uint64_t upto_ns) {
  if (!r.header) return 0;
  read_names(pid, r);
  const auto* slots = reinterpret_cast<const gs_launch_record*>(r.header + 1);
  const uint64_t mask = r.mask;
  size_t n = 0;
  for (;; ++n) {
    const gs_launch_record& slot = slots[r.read & mask];
    if (__atomic_load_n(&slot.seq, __ATOMIC_ACQUIRE) != r.read + 1) break;
    gs_launch_record copy;
    std::memcpy(&copy, &slot, sizeof copy);
    to_ns(r.clock, copy);
    if (copy.ts_ns > upto_ns) break;
    ++r.read;
    // A claimed ring's launches from before the claim (written while an earlier reader let go).
    if (copy.ts_ns >= r.since_ns) on(uint32_t(pid), copy);
    // Free the slots now and then, not at every record: the writers read the tail at each launch.
    if ((n & 255) == 255) __atomic_store_n(&r.header->tail, r.read, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&r.header->tail, r.read, __ATOMIC_RELEASE);
  return n;
}

void LaunchRings::to_ns(uint32_t clock, gs_launch_record& r) const {
  if (clock != GS_LAUNCH_CLOCK_TSC) return;
  r.ts_ns = tsc_.to_ns(r.ts_ns);
  // A saturated span stays saturated.
  r.duration_ns = r.duration_ns == UINT32_MAX ? UINT32_MAX : uint32_t(std::min<uint64_t>(tsc_.span_ns(r.duration_ns), UINT32_MAX));
}

bool LaunchRings::times_to_ns(pid_t pid, gs_launch_record& r) const {
  std::lock_guard lock(mu_);
  auto it = rings_.find(pid);
  if (it == rings_.end()) return false;
  to_ns(it->second.clock, r);
  return true;
}

size_t LaunchRings::drain(const OnLaunch& on, uint64_t upto_ns) {
  std::lock_guard lock(mu_);
  tsc_.sample();
  size_t n = 0;
  for (auto& [pid, r] : retired_) {
    n += drain_one(pid, r, on);
    lost_gone_ += lost_of(r);
    names_lost_gone_ += __atomic_load_n(&r.header->names_lost, __ATOMIC_RELAXED);
    release(r);
  }
  retired_.clear();
  for (auto& [pid, r] : rings_) n += drain_one(pid, r, on, upto_ns);
  return n;
}

void LaunchRings::forget(pid_t pid, const OnLaunch& on) {
  std::lock_guard lock(mu_);
  auto it = rings_.find(pid);
  if (it == rings_.end()) return;
  tsc_.sample();
  // A claimed ring is paused before its last reading: what its process writes after that is the
  // next reader's.
  if (it->second.claimed) __atomic_store_n(&it->second.header->paused, 1u, __ATOMIC_RELEASE);
  drain_one(pid, it->second, on);
  lost_gone_ += lost_of(it->second);
  names_lost_gone_ += __atomic_load_n(&it->second.header->names_lost, __ATOMIC_RELAXED);
  release(it->second);
  rings_.erase(it);
}

bool LaunchRings::to_call_record(uint32_t pid, const gs_launch_record& r, const std::string& comm,
                                 gs_call_record& out) {
  // As the probe on gpuscope_launch_stack records a launch it is handed, without a stack: one
  // decoder for both (decode::decode_in_process_launch).
  static const cuda::FunctionSpec* const marker = cuda::function_by_symbol("gpuscope_launch_stack");
  if (!decode::launch_api_function(r.api)) return false;
  out = {};
  out.kind = GS_REC_CALL;
  out.func = marker->id;
  out.flags = GS_CALL_DEREF_OK | (r.flags & GS_LAUNCH_STACK_LEFT_OUT ? GS_CALL_STACK_SAMPLED_OUT : 0);
  out.ts_ns = r.ts_ns;
  out.pid = pid;
  out.tid = r.tid;
  out.deref_len = sizeof r;
  std::memcpy(out.deref, &r, sizeof r);
  std::memcpy(out.comm, comm.data(), std::min(comm.size(), sizeof(out.comm) - 1));
  return true;
}

size_t LaunchRings::rings() const {
  std::lock_guard lock(mu_);
  return rings_.size();
}

std::set<pid_t> LaunchRings::received() const {
  std::lock_guard lock(mu_);
  return received_;
}

void LaunchRings::set_stack_every(pid_t pid, uint32_t every) {
  std::lock_guard lock(mu_);
  if (auto it = rings_.find(pid); it != rings_.end() && it->second.header)
    __atomic_store_n(&it->second.header->stack_every, every, __ATOMIC_RELAXED);
}

uint64_t LaunchRings::lost_of(const Ring& r) const {
  const uint64_t lost = __atomic_load_n(&r.header->lost, __ATOMIC_RELAXED);
  return lost > r.lost_before ? lost - r.lost_before : 0;
}

uint64_t LaunchRings::lost() const {
  std::lock_guard lock(mu_);
  uint64_t n = lost_gone_;
  for (const auto& [pid, r] : rings_)
    if (r.header) n += lost_of(r);
  return n;
}

uint64_t LaunchRings::names_lost() const {
  std::lock_guard lock(mu_);
  uint64_t n = names_lost_gone_;
  for (const auto& [pid, r] : rings_)
    if (r.header) n += __atomic_load_n(&r.header->names_lost, __ATOMIC_RELAXED);
  return n;
}

}  // namespace gpuscope::record
