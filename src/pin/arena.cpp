#include "pin/arena.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace gpuscope::pin {
namespace {

// Straight to the kernel: in libgpuscope_pin.so the C library's names are the library's own
// wrappers, which look at the arena.
void* sys_mmap(void* addr, size_t len, int prot, int flags) {
  return reinterpret_cast<void*>(syscall(SYS_mmap, addr, len, prot, flags, -1, 0));
}
void* sys_mremap(void* old, size_t old_len, size_t new_len, int flags, void* to) {
  return reinterpret_cast<void*>(syscall(SYS_mremap, old, old_len, new_len, flags, to));
}

}  // namespace

size_t Arena::page_round(size_t bytes) {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) & ~(page - 1);
}

Arena::~Arena() {
  if (base_) syscall(SYS_munmap, base_, bytes_);
}

bool Arena::reserve(std::initializer_list<size_t> sizes) {
  if (base_) return true;
  // Largest first: a limit on address space (ulimit -v) or strict overcommit refuses the large ones.
  for (size_t want : sizes) {
    void* p = sys_mmap(nullptr, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
    if (p == MAP_FAILED) continue;
    base_ = reinterpret_cast<uintptr_t>(p);
    bytes_ = want;
    return true;
  }
  return false;
}

// Ranges of 2 MiB or more start on a 2 MiB boundary and are whole 2 MiB units: the kernel backs
// them with huge pages where it can, as it does the C library's large mappings (measured: a
// checkpoint's 64 MiB copies to host memory 7% slower without).
size_t Arena::unit(size_t bytes) { return bytes >= kHuge ? (bytes + kHuge - 1) & ~(kHuge - 1) : page_round(bytes); }

uintptr_t Arena::take_addresses(size_t bytes) {
  const size_t align = bytes >= kHuge ? kHuge : 1;
  // Best fit among the ranges given back that start as aligned; the rest of one stays free.
  for (auto it = free_.lower_bound(bytes); it != free_.end(); ++it) {
    if (it->second & (align - 1)) continue;
    const size_t len = it->first;
    const uintptr_t a = it->second;
    free_.erase(it);
    if (len > bytes) free_.emplace(len - bytes, a + bytes);
    return a;
  }
  uintptr_t a = (base_ + used_ + align - 1) & ~uintptr_t(align - 1);
  if (a + bytes > base_ + bytes_) return 0;
  if (a > base_ + used_) free_.emplace(a - (base_ + used_), base_ + used_);  // the gap stays usable
  used_ = a + bytes - base_;
  return a;
}

void Arena::keep_addresses(uintptr_t a, size_t bytes) {
  // The newest range at the top goes back to the bump pointer: a program that allocates and frees
  // in turn reuses the same addresses without splitting the free list.
  if (a + bytes == base_ + used_) {
    used_ -= bytes;
    return;
  }
  free_.emplace(bytes, a);
}

void* Arena::take(size_t bytes) {
  if (!base_ || !bytes) return nullptr;
  bytes = unit(bytes);
  const uintptr_t a = take_addresses(bytes);
  if (!a) return nullptr;
  void* p = reinterpret_cast<void*>(a);
  if (syscall(SYS_mprotect, p, bytes, PROT_READ | PROT_WRITE) != 0) {
    keep_addresses(a, bytes);
    return nullptr;
  }
  return p;
}

void Arena::give(void* p, size_t bytes) {
  bytes = unit(bytes);
  // A fresh PROT_NONE mapping over the range: its pages and their commit charge go back at once.
  if (sys_mmap(p, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED) == MAP_FAILED) return;
  keep_addresses(reinterpret_cast<uintptr_t>(p), bytes);
}

void* Arena::grow(void* p, size_t old_bytes, size_t new_bytes) {
  old_bytes = unit(old_bytes);
  new_bytes = unit(new_bytes);
  const uintptr_t a = take_addresses(new_bytes);
  if (!a) return nullptr;
  void* to = sys_mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(a));
  if (to == MAP_FAILED) {
    keep_addresses(a, new_bytes);
    return nullptr;
  }
  // mremap left a hole where the range was: reserve it again before reusing its addresses.
  if (sys_mmap(p, old_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED) != MAP_FAILED)
    keep_addresses(reinterpret_cast<uintptr_t>(p), old_bytes);
  return to;
}

}  // namespace gpuscope::pin
