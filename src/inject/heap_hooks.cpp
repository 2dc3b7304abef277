// The heap hooks of libgpuscope_launches.so: the program's large heap blocks, with the stacks that
// allocated them, for `gpuscope advise` (issue 35). The C library serves allocations of 128 KiB
// and more with mmap at first, which gpuscope sees from the kernel's tracepoints; but it raises
// that threshold (up to 32 MiB) each time such a block is freed, and from then on serves blocks of
// that size from its heap, where no system call shows them: a training loop's batches after the
// first two, on the H200. So the allocation functions are interposed here:
//  - each call goes on to the next allocator (the C library's, or one preloaded after this
//    library: tcmalloc, jemalloc, gpuscope pin's), found with the C library's dlsym(RTLD_NEXT);
//    the program's allocator does not change;
//  - a block of GS_HEAP_ALLOC_ENV bytes or more is handed to gpuscope_heap_alloc(ptr, bytes,
//    unrecorded), which gpuscope probes (a trap, and the stack); its freeing, or its move by
//    realloc, to gpuscope_heap_free(ptr). Smaller ones cost a comparison.
// Bounded: GS_HEAP_ALLOCS_PER_S blocks a second at most, after a burst of as many (the rest are
// counted and said with the next one handed over), and a table of the blocks handed over and
// still live, whose frees are looked for (a block that does not fit is not handed over).
// Without GS_HEAP_ALLOC_ENV (the library preloaded by a service's owner) the hooks only pass
// calls on. While dlsym finds the next allocator, its own allocations come from a static buffer.
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <atomic>

#include "inject/heap_hooks.h"
#include "inject/probe_marker.h"

// Probed by gpuscope (bpf/host_allocs.bpf.c); they do nothing (probe_marker.h).
extern "C" void gpuscope_heap_alloc(void* ptr, size_t bytes, uint32_t unrecorded);
extern "C" void gpuscope_heap_free(void* ptr);
GS_PROBE_MARKER(gpuscope_heap_alloc, "");
GS_PROBE_MARKER(gpuscope_heap_free, "nop\n");


namespace {

using MallocFn = void* (*)(size_t);
using FreeFn = void (*)(void*);
using CallocFn = void* (*)(size_t, size_t);
using ReallocFn = void* (*)(void*, size_t);
using PosixMemalignFn = int (*)(void**, size_t, size_t);
using AlignedFn = void* (*)(size_t, size_t);

struct Next {
  MallocFn malloc;
  FreeFn free;
  CallocFn calloc;
  ReallocFn realloc;
  PosixMemalignFn posix_memalign;
  AlignedFn aligned_alloc;
  AlignedFn memalign;
};
Next g_next{};
std::atomic<bool> g_resolved{false};
__attribute__((tls_model("initial-exec"))) thread_local bool t_resolving = false;

// What dlsym allocates while it finds the next allocator (an error message's buffer at most).
alignas(64) char g_boot[64 << 10];
std::atomic<size_t> g_boot_used{0};

void* boot_alloc(size_t n, size_t align = 16) {
  if (align < 16) align = 16;
  size_t at = g_boot_used.load(std::memory_order_relaxed), start;
  do {
    start = (at + align - 1) & ~(align - 1);
    if (start + n > sizeof g_boot || start + n < start) return nullptr;
  } while (!g_boot_used.compare_exchange_weak(at, start + n, std::memory_order_relaxed));
  return g_boot + start;  // zeros: never handed out twice
}
bool in_boot(const void* p) {
  return static_cast<const char*>(p) >= g_boot && static_cast<const char*>(p) < g_boot + sizeof g_boot;
}

template <typename T>
T find(void* (*dl)(void*, const char*), const char* name) {
  return reinterpret_cast<T>(dl(RTLD_NEXT, name));
}

// The C library's dlsym, called from here: RTLD_NEXT then means after this library (whose own
// dlsym is launch_hooks.cpp's stand-in).
void resolve() {
  if (g_resolved.load(std::memory_order_acquire)) return;
  t_resolving = true;
  void* (*dl)(void*, const char*) = nullptr;
  for (const char* v : {"GLIBC_2.34", "GLIBC_2.2.5"})
    if (void* p = dlvsym(RTLD_NEXT, "dlsym", v)) {
      dl = reinterpret_cast<void* (*)(void*, const char*)>(p);
      break;
    }
  if (dl) {
    Next n{};
    n.malloc = find<MallocFn>(dl, "malloc");
    n.free = find<FreeFn>(dl, "free");
    n.calloc = find<CallocFn>(dl, "calloc");
    n.realloc = find<ReallocFn>(dl, "realloc");
    n.posix_memalign = find<PosixMemalignFn>(dl, "posix_memalign");
    n.aligned_alloc = find<AlignedFn>(dl, "aligned_alloc");
    n.memalign = find<AlignedFn>(dl, "memalign");
    if (n.malloc && n.free && n.calloc && n.realloc && n.posix_memalign && n.aligned_alloc && n.memalign) {
      g_next = n;
      g_resolved.store(true, std::memory_order_release);
    }
  }
  t_resolving = false;
}

// Off (SIZE_MAX) until the library's constructor reads the environment.
size_t g_min_bytes = SIZE_MAX;

// The blocks handed over and not yet freed: open addressing on the block's address, a
// tombstone where one was freed. Bounded probes: a block that finds no slot is not handed over.
constexpr size_t kSlots = 8192, kProbes = 32;
constexpr uintptr_t kTombstone = 1;
std::atomic<uintptr_t> g_live[kSlots];
std::atomic<int64_t> g_live_count{0};

size_t slot_of(uintptr_t p) { return size_t(((p >> 4) * 0x9E3779B97F4A7C15ull) >> 51) & (kSlots - 1); }

bool live_insert(uintptr_t p) {
  const size_t s = slot_of(p);
  for (size_t i = 0; i < kProbes; ++i) {
    auto& cell = g_live[(s + i) & (kSlots - 1)];
    uintptr_t v = cell.load(std::memory_order_relaxed);
    if ((v == 0 || v == kTombstone) && cell.compare_exchange_strong(v, p, std::memory_order_relaxed)) {
      g_live_count.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}
// Its slot, or nullptr.
std::atomic<uintptr_t>* live_find(uintptr_t p) {
  const size_t s = slot_of(p);
  for (size_t i = 0; i < kProbes; ++i) {
    auto& cell = g_live[(s + i) & (kSlots - 1)];
    const uintptr_t v = cell.load(std::memory_order_relaxed);
    if (v == p) return &cell;
    if (v == 0) return nullptr;
  }
  return nullptr;
}

// The rate limit: a cell rate algorithm on the coarse monotonic clock (a read of the vDSO's page).
std::atomic<uint64_t> g_tat{0};
std::atomic<uint32_t> g_unrecorded{0};
constexpr uint64_t kIntervalNs = 1'000'000'000ull / GS_HEAP_ALLOCS_PER_S;

bool allowed() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const uint64_t now = uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
  uint64_t tat = g_tat.load(std::memory_order_relaxed);
  do {
    if (tat > now + GS_HEAP_ALLOCS_PER_S * kIntervalNs) return false;
  } while (!g_tat.compare_exchange_weak(tat, (tat > now ? tat : now) + kIntervalNs, std::memory_order_relaxed));
  return true;
}

void note_alloc(void* p, size_t n) {
  const int saved = errno;  // the program's: clock_gettime and the probe leave it as it was, to be sure
  if (allowed() && live_insert(reinterpret_cast<uintptr_t>(p)))
    gpuscope_heap_alloc(p, n, g_unrecorded.exchange(0, std::memory_order_relaxed));
  else
    g_unrecorded.fetch_add(1, std::memory_order_relaxed);
  errno = saved;
}

// Before the block goes back to its allocator: after, another thread may be given its address.
void note_free(void* p) {
  if (g_live_count.load(std::memory_order_relaxed) <= 0) return;
  auto* cell = live_find(reinterpret_cast<uintptr_t>(p));
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (cell && cell->compare_exchange_strong(v, kTombstone, std::memory_order_relaxed)) {
    g_live_count.fetch_sub(1, std::memory_order_relaxed);
    gpuscope_heap_free(p);
  }
}

bool big(size_t n) { return __builtin_expect(n >= g_min_bytes, 0); }

// What was not handed over since the last block that was is said at exit, with no block.
__attribute__((destructor)) void say_unrecorded() {
  if (const uint32_t n = g_unrecorded.exchange(0, std::memory_order_relaxed)) gpuscope_heap_alloc(nullptr, 0, n);
}

__attribute__((constructor)) void read_settings() {
  const char* v = getenv(GS_HEAP_ALLOC_ENV);
  if (!v || !*v) return;
  const unsigned long long n = strtoull(v, nullptr, 10);
  if (n > 0) g_min_bytes = size_t(n);
}

}  // namespace

#define GS_EXPORT extern "C" __attribute__((visibility("default")))

GS_EXPORT void* malloc(size_t n) {
  if (__builtin_expect(!g_resolved.load(std::memory_order_acquire), 0)) {
    if (t_resolving) return boot_alloc(n);
    resolve();
    if (!g_resolved.load(std::memory_order_acquire)) return boot_alloc(n);
  }
  void* p = g_next.malloc(n);
  if (big(n) && p) note_alloc(p, n);
  return p;
}

GS_EXPORT void free(void* p) {
  if (!p || in_boot(p)) return;
  note_free(p);
  if (__builtin_expect(!g_resolved.load(std::memory_order_acquire), 0)) {
    resolve();
    if (!g_resolved.load(std::memory_order_acquire)) return;  // nothing but boot blocks could be out
  }
  g_next.free(p);
}

GS_EXPORT void* calloc(size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (__builtin_expect(!g_resolved.load(std::memory_order_acquire), 0)) {
    if (t_resolving) return boot_alloc(n);  // zeros already
    resolve();
    if (!g_resolved.load(std::memory_order_acquire)) return boot_alloc(n);
  }
  void* p = g_next.calloc(count, size);
  if (big(n) && p) note_alloc(p, n);
  return p;
}

GS_EXPORT void* realloc(void* p, size_t n) {
  if (in_boot(p)) {
    // A block dlsym allocated, grown by the program's allocator from now on.
    void* q = malloc(n);
    if (q) memcpy(q, p, std::min<size_t>(n, size_t(g_boot + sizeof g_boot - static_cast<char*>(p))));
    return q;
  }
  if (__builtin_expect(!g_resolved.load(std::memory_order_acquire), 0)) {
    if (t_resolving) return p ? nullptr : boot_alloc(n);
    resolve();
    if (!g_resolved.load(std::memory_order_acquire)) return p ? nullptr : boot_alloc(n);
  }
  const bool handed = p && g_live_count.load(std::memory_order_relaxed) > 0 && live_find(reinterpret_cast<uintptr_t>(p));
  void* q = g_next.realloc(p, n);
  // Moved, resized or freed (n 0): the block handed over is no more; what replaced it is new.
  if (handed && (q || n == 0)) note_free(p);
  if (big(n) && q) note_alloc(q, n);
  return q;
}

GS_EXPORT int posix_memalign(void** out, size_t align, size_t n) {
  if (__builtin_expect(!g_resolved.load(std::memory_order_acquire), 0)) {
    if (!t_resolving) resolve();
    if (!g_resolved.load(std::memory_order_acquire)) {
      *out = boot_alloc(n, align);
      return *out ? 0 : ENOMEM;
    }
  }
  const int rc = g_next.posix_memalign(out, align, n);
  if (big(n) && rc == 0 && *out) note_alloc(*out, n);
  return rc;
}

GS_EXPORT void* aligned_alloc(size_t align, size_t n) {
  if (__builtin_expect(!g_resolved.load(std::memory_order_acquire), 0)) {
    if (!t_resolving) resolve();
    if (!g_resolved.load(std::memory_order_acquire)) return boot_alloc(n, align);
  }
  void* p = g_next.aligned_alloc(align, n);
  if (big(n) && p) note_alloc(p, n);
  return p;
}

GS_EXPORT void* memalign(size_t align, size_t n) {
  if (__builtin_expect(!g_resolved.load(std::memory_order_acquire), 0)) {
    if (!t_resolving) resolve();
    if (!g_resolved.load(std::memory_order_acquire)) return boot_alloc(n, align);
  }
  void* p = g_next.memalign(align, n);
  if (big(n) && p) note_alloc(p, n);
  return p;
}
