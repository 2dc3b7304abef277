// libgpuscope_pin.so: preloaded (LD_PRELOAD) into a program by `gpuscope pin`, or by its owner, it
// serves the program's large host buffers and pins with CUDA those that its copies to and from
// the GPU pay for (pin/pinner.h says when). Nothing in the program changes.
//  - The C library's allocation functions are interposed; allocations of GPUSCOPE_PIN_MIN_BYTES or
//    more are the pinner's, the rest go to the C library's own (__libc_malloc and its kin).
//  - Copies are seen where every CUDA program's reach the driver: the runtime (static or shared)
//    and the libraries get the driver's entry points from cuGetProcAddress, found with dlsym; this
//    library interposes dlsym and hands out wrappers of the copy functions (and exports them for
//    programs linked to libcuda).
//  - munmap, mremap, madvise and mmap are interposed so that no pinned range loses its pages
//    while registered; fork() marks the child, which makes no CUDA call.
// CUDA is called only from a copy the program made (or for a buffer of a site whose copies were
// seen), with the program's context; an asynchronous copy from or to memory pinned here waits
// for its stream, as it did from pageable memory, unless GPUSCOPE_PIN_RELAXED=1.
// Anything that fails leaves the program on the C library's malloc, with one line on stderr.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "inject/driver_interpose.h"
#include "pin/pinner.h"

extern "C" {
// The C library's dlsym (this library defines its own: driver_interpose.h).
__attribute__((visibility("hidden"))) void* (*gs_pin_real_dlsym)(void*, const char*) = nullptr;
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {

using gpuscope::pin::Driver;
using gpuscope::pin::Mode;
using gpuscope::pin::Pinner;
using gpuscope::pin::Settings;

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
using CUcontext = void*;
constexpr CUresult kNotFound = 500;            // CUDA_ERROR_NOT_FOUND
constexpr CUresult kAlreadyRegistered = 712;   // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
constexpr unsigned kRegisterPortable = 0x01;   // CU_MEMHOSTREGISTER_PORTABLE: pinned for every context
const CUstream kPerThreadStream = reinterpret_cast<CUstream>(0x2);  // CU_STREAM_PER_THREAD

using gpuscope::inject::DlsymFn;
size_t (*g_real_usable_size)(void*) = nullptr;

// In the pinner (or the driver, called by it): the allocations and mappings made there are the
// C library's and the kernel's. Initial-exec: a preloaded library's TLS is static, and reading it
// allocates nothing.
__attribute__((tls_model("initial-exec"))) thread_local bool t_inside = false;
struct Inside {
  bool was = t_inside;
  Inside() { t_inside = true; }
  ~Inside() { t_inside = was; }
};
std::atomic<bool> g_child{false};
std::atomic<bool> g_cuda_initialised{false};  // the program looked up cuGetProcAddress
bool g_relaxed = false;
std::atomic<uint64_t> g_other_copies{0};  // host memory not the pinner's
std::atomic<uint64_t> g_waits{0};         // asynchronous copies of pinned memory waited for
// The program is exiting (its atexit handlers ran up to the one registered at its first copy,
// before the runtime's, which tear its context down): no more CUDA calls.
std::atomic<bool> g_exiting{false};
void at_exit() { g_exiting.store(true, std::memory_order_relaxed); }

void say(const char* fmt, ...) {
  if (std::getenv("GPUSCOPE_PIN_QUIET")) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "gpuscope pin: %s\n", line);
}

// ---- the driver ----

struct Cuda {
  void* lib = nullptr;
  CUresult (*host_register)(void*, size_t, unsigned) = nullptr;
  CUresult (*host_unregister)(void*) = nullptr;
  CUresult (*stream_sync)(CUstream) = nullptr;
  CUresult (*ctx_get)(CUcontext*) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  std::atomic<CUcontext> context{nullptr};  // the program's, seen at a copy
  std::atomic<bool> resolved{false};
  CUresult last_error = 0;
};
Cuda g_cuda;

void* libcuda() {
  if (!g_cuda.lib) g_cuda.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return g_cuda.lib;
}

// At a copy (the program has a context): the functions the pinner calls, and that context.
void saw_cuda() {
  if (g_child.load(std::memory_order_relaxed)) return;
  if (!g_cuda.resolved.load(std::memory_order_acquire)) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (!g_cuda.resolved.load(std::memory_order_relaxed) && libcuda() && gs_pin_real_dlsym) {
      auto get = [](const char* name) { return gs_pin_real_dlsym(g_cuda.lib, name); };
      g_cuda.host_register = reinterpret_cast<decltype(g_cuda.host_register)>(get("cuMemHostRegister_v2"));
      g_cuda.host_unregister = reinterpret_cast<decltype(g_cuda.host_unregister)>(get("cuMemHostUnregister"));
      g_cuda.stream_sync = reinterpret_cast<decltype(g_cuda.stream_sync)>(get("cuStreamSynchronize"));
      g_cuda.ctx_get = reinterpret_cast<decltype(g_cuda.ctx_get)>(get("cuCtxGetCurrent"));
      g_cuda.ctx_push = reinterpret_cast<decltype(g_cuda.ctx_push)>(get("cuCtxPushCurrent_v2"));
      g_cuda.ctx_pop = reinterpret_cast<decltype(g_cuda.ctx_pop)>(get("cuCtxPopCurrent_v2"));
      g_cuda.resolved.store(true, std::memory_order_release);
    }
    pthread_mutex_unlock(&mu);
  }
  if (!g_cuda.context.load(std::memory_order_relaxed) && g_cuda.ctx_get) {
    CUcontext c = nullptr;
    if (g_cuda.ctx_get(&c) == 0 && c) {
      g_cuda.context.store(c, std::memory_order_relaxed);
      std::atexit(at_exit);
    }
  }
}

// Runs f with the program's context current on this thread (a thread that frees a buffer need
// not have one).
template <typename F>
CUresult in_context(F f) {
  CUcontext current = nullptr;
  bool pushed = false;
  if (g_cuda.ctx_get && g_cuda.ctx_get(&current) == 0 && !current && g_cuda.ctx_push)
    pushed = g_cuda.ctx_push(g_cuda.context.load(std::memory_order_relaxed)) == 0;
  const CUresult r = f();
  if (pushed) {
    CUcontext popped = nullptr;
    g_cuda.ctx_pop(&popped);
  }
  return r;
}

class DriverCalls : public Driver {
 public:
  bool usable() override {
    return !g_child.load(std::memory_order_relaxed) && !g_exiting.load(std::memory_order_relaxed) &&
           g_cuda.host_register && g_cuda.host_unregister && g_cuda.context.load(std::memory_order_relaxed);
  }
  Result register_range(void* p, size_t bytes) override {
    const CUresult r = in_context([&] { return g_cuda.host_register(p, bytes, kRegisterPortable); });
    if (r == 0) return Result::ok;
    if (r == kAlreadyRegistered) return Result::already;
    g_cuda.last_error = r;
    return Result::failed;
  }
  void unregister_range(void* p, size_t) override {
    if (g_exiting.load(std::memory_order_relaxed) || !g_cuda.host_unregister) return;
    in_context([&] { return g_cuda.host_unregister(p); });
  }
};
DriverCalls g_driver;

// ---- the pinner, made at load ----

alignas(Pinner) unsigned char g_pinner_space[sizeof(Pinner)];
std::atomic<Pinner*> g_pinner{nullptr};
size_t g_min_bytes = SIZE_MAX;
bool g_want_sites = true;

inline Pinner* pinner() { return g_pinner.load(std::memory_order_acquire); }

size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || x < 0) return fallback;
  double scale = 1;
  switch (*end) {
    case 'k': case 'K': scale = 1024.0; break;
    case 'm': case 'M': scale = 1024.0 * 1024; break;
    case 'g': case 'G': scale = 1024.0 * 1024 * 1024; break;
  }
  return size_t(x * scale);
}

// An allocation's site: its call stack (up to 14 frames) and its size (a quarter of a power of
// two), hashed. The same line allocating the same tensor every step gives the same key. The key
// names frames by library and offset, not address, so that it holds from one run to the next
// (--profile, --use); each distinct stack's key is worked out once (dladdr per frame).
struct SiteWalk {
  uintptr_t ips[14];
  int frames = 0;
};
_Unwind_Reason_Code site_frame(_Unwind_Context* ctx, void* arg) {
  auto* w = static_cast<SiteWalk*>(arg);
  const uintptr_t ip = _Unwind_GetIP(ctx);
  if (!ip) return _URC_END_OF_STACK;
  w->ips[w->frames] = ip;
  return ++w->frames >= 14 ? _URC_END_OF_STACK : _URC_NO_REASON;
}
uint64_t size_class(size_t bytes) {
  const int log = 63 - __builtin_clzll(bytes | 1);
  const uint64_t quarter = log >= 2 ? (bytes >> (log - 2)) & 3 : 0;
  return uint64_t(log) << 2 | quarter;
}
constexpr uint64_t kFnvBasis = 1469598103934665603ull, kFnvPrime = 1099511628211ull;
uint64_t fnv(uint64_t h, const void* data, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * kFnvPrime;
  return h;
}
uint64_t stable_hash(const SiteWalk& w) {
  uint64_t h = kFnvBasis;
  for (int i = 0; i < w.frames; ++i) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(w.ips[i]), &info) && info.dli_fname) {
      const char* base = std::strrchr(info.dli_fname, '/');
      base = base ? base + 1 : info.dli_fname;
      h = fnv(h, base, std::strlen(base));
      const uint64_t offset = w.ips[i] - reinterpret_cast<uintptr_t>(info.dli_fbase);
      h = fnv(h, &offset, sizeof offset);
    } else {
      h = fnv(h, "?", 1);  // generated code: where it is says nothing across runs
    }
  }
  return h;
}
gpuscope::pin::SiteKey site_of(size_t bytes) {
  if (!g_want_sites) return size_class(bytes);
  SiteWalk w;
  _Unwind_Backtrace(&site_frame, &w);
  const uint64_t raw = fnv(kFnvBasis, w.ips, sizeof(uintptr_t) * w.frames);
  // Stacks seen before: their key from a small table (a collision only costs a recomputation).
  struct Entry {
    uint64_t raw = 0, stable = 0;
  };
  static Entry table[4096];
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  // Never waited for: a child forked while another thread held it would wait forever.
  Entry& e = table[raw % 4096];
  uint64_t stable = 0;
  if (pthread_mutex_trylock(&mu) == 0) {
    stable = e.raw == raw ? e.stable : 0;
    pthread_mutex_unlock(&mu);
  }
  if (!stable) {
    stable = stable_hash(w) | 1;
    if (pthread_mutex_trylock(&mu) == 0) {
      e.raw = raw, e.stable = stable;
      pthread_mutex_unlock(&mu);
    }
  }
  return (stable ^ size_class(bytes)) * kFnvPrime;
}

// libcuda's own code: its buffers stay the C library's, so that the driver, which may hold its
// locks while it allocates and frees, never waits for the pinner's (held across registrations).
bool from_driver(void* ret) {
  static std::atomic<uintptr_t> lo{0}, hi{0};
  static std::atomic<unsigned long long> scanned_adds{0};
  if (!hi.load(std::memory_order_acquire)) {
    // Looked for again only when a library has been loaded since (dl_iterate_phdr counts loads; the
    // first object is enough to read the count): no file is opened and no lock held for long.
    unsigned long long adds = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          *static_cast<unsigned long long*>(out) = info->dlpi_adds;
          return 1;
        },
        &adds);
    if (adds == scanned_adds.load(std::memory_order_relaxed)) return false;
    scanned_adds.store(adds, std::memory_order_relaxed);
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void*) {
          if (!info->dlpi_name || !std::strstr(info->dlpi_name, "libcuda.so")) return 0;
          uintptr_t a = UINTPTR_MAX, b = 0;
          for (int i = 0; i < info->dlpi_phnum; ++i)
            if (info->dlpi_phdr[i].p_type == PT_LOAD) {
              a = std::min<uintptr_t>(a, info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
              b = std::max<uintptr_t>(b, info->dlpi_addr + info->dlpi_phdr[i].p_vaddr + info->dlpi_phdr[i].p_memsz);
            }
          lo.store(a, std::memory_order_relaxed);
          hi.store(b, std::memory_order_release);
          return 1;
        },
        nullptr);
    if (!hi.load(std::memory_order_acquire)) return false;
  }
  const uintptr_t r = reinterpret_cast<uintptr_t>(ret);
  return r >= lo.load(std::memory_order_relaxed) && r < hi.load(std::memory_order_relaxed);
}

void* allocate(size_t bytes, bool zero, void* caller) {
  Pinner* p = pinner();
  if (!p || bytes < g_min_bytes || t_inside || from_driver(caller)) return nullptr;
  Inside inside;
  // Pinning everything: from the program's first CUDA call on (its runtime asked for the driver's
  // entry points), with its context if this thread has one.
  if (p->settings().mode == Mode::all && g_cuda_initialised.load(std::memory_order_relaxed)) saw_cuda();
  return p->allocate(bytes, zero, site_of(bytes));
}

constexpr const char* kModeNames[] = {"online", "all", "off"};

void write_report() {
  Pinner* p = pinner();
  const char* prefix = std::getenv("GPUSCOPE_PIN_REPORT");
  if (!p || !prefix || !*prefix) return;
  const auto s = p->stats();
  char path[4096];
  std::snprintf(path, sizeof path, "%s.%d.json", prefix, int(getpid()));
  FILE* f = std::fopen(path, "w");
  if (!f) return;
  std::fprintf(f,
               "{\"pid\": %d, \"child\": %s, \"mode\": \"%s\", \"buffers\": %llu, \"peak_live_bytes\": %llu, "
               "\"pageable_copies\": %llu, \"pageable_copy_bytes\": %llu, \"pinned_copies\": %llu, "
               "\"pinned_copy_bytes\": %llu, \"other_copies\": %llu, \"registrations\": %llu, "
               "\"unregistrations\": %llu, \"register_failures\": %llu, \"register_ms\": %.3f, "
               "\"unregister_ms\": %.3f, \"pool_hits\": %llu, \"fresh_pins\": %llu, \"declined_for_cap\": %llu, "
               "\"pinned_bytes\": %llu, \"peak_pinned_bytes\": %llu, \"modeled_saving_ms\": %.3f, "
               "\"registration_disabled\": %s, \"cuda_seen\": %s, \"last_cuda_error\": %d, "
               "\"unserved_copies\": %llu, \"waits\": %llu, \"min_bytes\": %llu, \"cap_bytes\": %llu}\n",
               int(getpid()), g_child ? "true" : "false", kModeNames[int(p->settings().mode)], (unsigned long long)s.buffers,
               (unsigned long long)s.peak_live_bytes, (unsigned long long)s.pageable_copies,
               (unsigned long long)s.pageable_copy_bytes, (unsigned long long)s.pinned_copies,
               (unsigned long long)s.pinned_copy_bytes, (unsigned long long)s.other_copies,
               (unsigned long long)s.registrations, (unsigned long long)s.unregistrations,
               (unsigned long long)s.register_failures, s.register_ms, s.unregister_ms,
               (unsigned long long)s.pool_hits, (unsigned long long)s.fresh_pins,
               (unsigned long long)s.declined_for_cap, (unsigned long long)s.pinned_bytes,
               (unsigned long long)s.peak_pinned_bytes, s.modeled_saving_ms,
               s.registration_disabled ? "true" : "false", g_cuda.context.load() ? "true" : "false",
               g_cuda.last_error, (unsigned long long)g_other_copies.load(), (unsigned long long)g_waits.load(),
               (unsigned long long)p->settings().min_bytes, (unsigned long long)p->settings().cap_bytes);
  std::fclose(f);
}

// --profile: what this run learned of its allocation sites, appended to the file (a run may be
// several processes); --use: read back at start.
constexpr const char* kProfileHeader = "# gpuscope pin profile 1: site finished copied saved_us";
void write_profile() {
  Pinner* p = pinner();
  const char* path = std::getenv("GPUSCOPE_PIN_PROFILE");
  if (!p || !path || !*path || g_child.load()) return;
  const auto sites = p->sites();
  if (sites.empty()) return;
  FILE* f = std::fopen(path, "a");
  if (!f) {
    say("cannot write the profile %s: %s", path, std::strerror(errno));
    return;
  }
  if (std::ftell(f) == 0) std::fprintf(f, "%s\n", kProfileHeader);
  for (const auto& s : sites)
    std::fprintf(f, "%016llx %llu %llu %.1f\n", (unsigned long long)s.key, (unsigned long long)s.finished,
                 (unsigned long long)s.copied, s.saved_us);
  std::fclose(f);
}
void read_profile(Pinner& p) {
  const char* path = std::getenv("GPUSCOPE_PIN_USE");
  if (!path || !*path) return;
  FILE* f = std::fopen(path, "r");
  if (!f) {
    say("cannot read the profile %s: %s; starting without it", path, std::strerror(errno));
    return;
  }
  std::vector<gpuscope::pin::SiteRecord> records;
  char line[256];
  bool header = false;
  while (std::fgets(line, sizeof line, f)) {
    if (!std::strncmp(line, kProfileHeader, std::strlen(kProfileHeader))) {
      header = true;
      continue;
    }
    unsigned long long key = 0, finished = 0, copied = 0;
    double saved = 0;
    if (header && std::sscanf(line, "%llx %llu %llu %lf", &key, &finished, &copied, &saved) == 4)
      records.push_back({key, finished, copied, saved});
  }
  std::fclose(f);
  if (!header) say("%s is not a profile of gpuscope pin --profile; starting without it", path);
  p.seed(records);
}

void before_fork() {
  if (Pinner* p = pinner()) p->lock();
}
void after_fork_parent() {
  if (Pinner* p = pinner()) p->unlock();
}
void after_fork_child() {
  g_child.store(true, std::memory_order_relaxed);
  if (Pinner* p = pinner()) {
    p->forked_child();
    p->unlock();
  }
}

}  // namespace

// ---- the C library's allocation functions ----
#define GS_EXPORT extern "C" __attribute__((visibility("default")))

#define GS_CALLER __builtin_return_address(0)

GS_EXPORT void* malloc(size_t n) {
  if (void* p = allocate(n, false, GS_CALLER)) return p;
  return __libc_malloc(n);
}
GS_EXPORT void free(void* p) {
  if (Pinner* pin = pinner(); pin && pin->owns(p)) {
    Inside inside;
    pin->release(p);
    return;
  }
  __libc_free(p);
}
GS_EXPORT void* calloc(size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (void* p = allocate(bytes, true, GS_CALLER)) return p;
  return __libc_calloc(n, size);
}
GS_EXPORT void* realloc(void* p, size_t n) {
  Pinner* pin = pinner();
  if (!p) {
    if (void* q = allocate(n, false, GS_CALLER)) return q;
    return __libc_malloc(n);
  }
  if (pin && pin->owns(p)) {
    Inside inside;
    if (!n) {
      pin->release(p);
      return nullptr;
    }
    if (void* q = pin->reallocate(p, n)) return q;
    // No addresses left: the C library's memory, the contents moved.
    void* q = __libc_malloc(n);
    if (!q) return nullptr;
    const size_t had = pin->usable_size(p);
    std::memcpy(q, p, had < n ? had : n);
    pin->release(p);
    return q;
  }
  // The C library's buffer growing past the threshold becomes a served one.
  if (pin && n >= g_min_bytes && !t_inside && g_real_usable_size) {
    if (void* q = allocate(n, false, GS_CALLER)) {
      const size_t had = g_real_usable_size(p);
      std::memcpy(q, p, had < n ? had : n);
      __libc_free(p);
      return q;
    }
  }
  return __libc_realloc(p, n);
}
GS_EXPORT int posix_memalign(void** out, size_t align, size_t n) {
  if (align < sizeof(void*) || (align & (align - 1))) return EINVAL;
  // Served buffers start on a page.
  if (align <= 4096)
    if (void* p = allocate(n, false, GS_CALLER)) {
      *out = p;
      return 0;
    }
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
namespace {
void* aligned(size_t align, size_t n, void* caller) {
  if (align <= 4096)
    if (void* p = allocate(n, false, caller)) return p;
  return __libc_memalign(align, n);
}
}  // namespace
GS_EXPORT void* aligned_alloc(size_t align, size_t n) { return aligned(align, n, GS_CALLER); }
GS_EXPORT void* memalign(size_t align, size_t n) { return aligned(align, n, GS_CALLER); }
GS_EXPORT void* valloc(size_t n) { return aligned(4096, n, GS_CALLER); }
GS_EXPORT void* pvalloc(size_t n) { return aligned(4096, (n + 4095) & ~size_t(4095), GS_CALLER); }
GS_EXPORT size_t malloc_usable_size(void* p) {
  if (Pinner* pin = pinner(); pin && pin->owns(p)) {
    Inside inside;
    return pin->usable_size(p);
  }
  return g_real_usable_size ? g_real_usable_size(p) : 0;
}

// ---- the program's mappings ----

// Only ranges of the arena concern the pinner; anything else passes with one comparison.
GS_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (Pinner* pin = pinner(); pin && (flags & MAP_FIXED) && !t_inside) {
    Inside inside;
    pin->unmapping(addr, len);
  }
  return reinterpret_cast<void*>(syscall(SYS_mmap, addr, len, prot, flags, fd, off));
}
GS_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}
GS_EXPORT int munmap(void* addr, size_t len) {
  if (Pinner* pin = pinner(); pin && !t_inside) {
    Inside inside;
    pin->unmapping(addr, len);
  }
  return int(syscall(SYS_munmap, addr, len));
}
GS_EXPORT void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) {
  void* new_addr = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  if (Pinner* pin = pinner(); pin && !t_inside) {
    Inside inside;
    pin->unmapping(old, old_len);
    if (flags & MREMAP_FIXED) pin->unmapping(new_addr, new_len);
  }
  return reinterpret_cast<void*>(syscall(SYS_mremap, old, old_len, new_len, flags, new_addr));
}
GS_EXPORT int madvise(void* addr, size_t len, int advice) {
  // Advice that replaces the range's pages (they read as zeros, or as the file, after it).
  constexpr int kDontneedLocked = 24;  // MADV_DONTNEED_LOCKED, Linux 5.18
  const bool discards =
      advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE || advice == kDontneedLocked;
  if (Pinner* pin = pinner(); pin && discards && !t_inside) {
    Inside inside;
    pin->unmapping(addr, len);
  }
  return int(syscall(SYS_madvise, addr, len, advice));
}

// ---- the driver's copy functions ----

namespace {

enum class Side { to_device, to_host, either };
using SyncCopyFn = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t);
using AsyncCopyFn = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);

// A wrapper serves one real address; up to kSlots an entry point (cuGetProcAddress hands out a
// version per CUDA version and per default-stream flavour asked for).
constexpr int kSlots = 4;
struct Hook {
  const char* symbol;  // as cuGetProcAddress is asked for it
  const char* exported, *exported_per_thread;  // libcuda's names
  Side side;
  bool async;
  gpuscope::inject::Slots<kSlots> slots;
  bool per_thread[kSlots];  // the slot's real function is the per-thread default stream's
};
Hook g_hooks[] = {
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", Side::to_device, false, {}, {}},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds", Side::to_host, false, {}, {}},
    {"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz", Side::to_device, true, {}, {}},
    {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz", Side::to_host, true, {}, {}},
    {"cuMemcpy", "cuMemcpy", "cuMemcpy_ptds", Side::either, false, {}, {}},
    {"cuMemcpyAsync", "cuMemcpyAsync", "cuMemcpyAsync_ptsz", Side::either, true, {}, {}},
};
constexpr int kHooks = sizeof(g_hooks) / sizeof(g_hooks[0]);

// A copy through hook h's real function: counted, the buffer pinned when its copies pay, and
// (strict) waited for when pinning made an asynchronous copy truly asynchronous.
CUresult copy(int h, int slot, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  const Hook& k = g_hooks[h];
  void* real = k.slots.real[slot].load(std::memory_order_acquire);
  if (!real) return kNotFound;
  bool pinned = false;
  Pinner* pin = pinner();
  if (pin && !t_inside && !g_child.load(std::memory_order_relaxed)) {
    const void* host = nullptr;
    bool to_device = k.side == Side::to_device;
    if (k.side == Side::to_device) host = reinterpret_cast<const void*>(src);
    else if (k.side == Side::to_host) host = reinterpret_cast<const void*>(dst);
    else if (pin->owns(reinterpret_cast<const void*>(src))) host = reinterpret_cast<const void*>(src), to_device = true;
    else host = reinterpret_cast<const void*>(dst);
    saw_cuda();
    if (pin->owns(host)) {
      Inside inside;
      pinned = pin->on_copy(host, n, to_device).pinned;
    } else if (k.side != Side::either) {
      g_other_copies.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const CUresult r = k.async ? reinterpret_cast<AsyncCopyFn>(real)(dst, src, n, stream)
                             : reinterpret_cast<SyncCopyFn>(real)(dst, src, n);
  if (r == 0 && pinned && k.async && !g_relaxed && g_cuda.stream_sync) {
    // From pageable memory the call returned once the source was staged (to the host: once the
    // copy was done): the program may reuse the buffer at once. Pinned, that holds after the wait.
    g_cuda.stream_sync(stream ? stream : k.per_thread[slot] ? kPerThreadStream : nullptr);
    g_waits.fetch_add(1, std::memory_order_relaxed);
  }
  return r;
}

template <int H, int S, bool Async = false>
struct Wrap {
  static CUresult call(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(H, S, dst, src, n, nullptr); }
};
template <int H, int S>
struct Wrap<H, S, true> {
  static CUresult call(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return copy(H, S, dst, src, n, s); }
};
template <int H, int... S>
void fill_wrappers(std::integer_sequence<int, S...>) {
  constexpr bool async = H == 2 || H == 3 || H == 5;
  ((g_hooks[H].slots.wrappers[S] = reinterpret_cast<void*>(&Wrap<H, S, async>::call)), ...);
}
static_assert(kHooks == 6, "fill_wrappers' async hooks are 2, 3 and 5");

struct PinTag;
using Lookup = gpuscope::inject::ProcAddress<PinTag>;
extern "C" void* gs_pin_dlsym_filter(void* handle, const char* name);
bool is_ours(void* address) {
  return gpuscope::inject::in_library_of(reinterpret_cast<const void*>(&gs_pin_dlsym_filter), address);
}

// The wrapper to hand out for `real`, an address of hook h.
void* wrapper_for(int h, void* real) {
  Hook& k = g_hooks[h];
  return k.slots.wrapper_for(real, [&](int s) {
    k.per_thread[s] = libcuda() && gs_pin_real_dlsym && gs_pin_real_dlsym(g_cuda.lib, k.exported_per_thread) == real;
  });
}

int hook_index(const char* symbol) {
  for (int h = 0; h < kHooks; ++h)
    if (!std::strcmp(symbol, g_hooks[h].symbol)) return h;
  return -1;
}
int hook_of_export(const char* name) {
  for (int h = 0; h < kHooks; ++h)
    if (!std::strcmp(name, g_hooks[h].exported) || !std::strcmp(name, g_hooks[h].exported_per_thread)) return h;
  return -1;
}

// What the driver's cuGetProcAddress hands out, the copy functions swapped for wrappers.
int after_lookup(int r, const char* symbol, void** pfn) {
  if (const int h = hook_index(symbol); h >= 0 && !is_ours(*pfn)) *pfn = wrapper_for(h, *pfn);
  return r;
}

}  // namespace

// Called by dlsym before the C library's: the address to return instead, or null.
extern "C" __attribute__((visibility("hidden"))) void* gs_pin_dlsym_filter(void* handle, const char* name) {
  if (!gs_pin_real_dlsym || !name || name[0] != 'c' || name[1] != 'u') return nullptr;
  if (void* stand_in = Lookup::for_dlsym(handle, name)) {
    Lookup::libcuda = libcuda();
    g_cuda_initialised.store(true, std::memory_order_relaxed);
    return stand_in;
  }
  const int h = hook_of_export(name);
  if (h < 0) return nullptr;
  void* real = gs_pin_real_dlsym(handle, name);
  if (!real || is_ours(real)) return nullptr;
  libcuda();
  return wrapper_for(h, real);
}
GS_DLSYM_TRAMPOLINE(gs_pin_dlsym_filter, gs_pin_real_dlsym);

// Programs linked to libcuda call these by name: the next definition (libcuda's) behind a wrapper.
namespace {
void* next_export(std::atomic<void*>& cached, const char* name) {
  void* real = cached.load(std::memory_order_relaxed);
  if (real || !gs_pin_real_dlsym) return real;
  real = gs_pin_real_dlsym(RTLD_NEXT, name);
  if (real && !is_ours(real)) {
    const int h = hook_of_export(name);
    real = h >= 0 ? wrapper_for(h, real) : real;
    cached.store(real, std::memory_order_relaxed);
    return real;
  }
  return nullptr;
}
}  // namespace
#define GS_COPY3(name)                                                                   \
  GS_EXPORT CUresult name(CUdeviceptr dst, CUdeviceptr src, size_t n) {                 \
    static std::atomic<void*> next{nullptr};                                             \
    void* f = next_export(next, #name);                                                  \
    return f ? reinterpret_cast<SyncCopyFn>(f)(dst, src, n) : kNotFound;                 \
  }
#define GS_COPY4(name)                                                                   \
  GS_EXPORT CUresult name(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {     \
    static std::atomic<void*> next{nullptr};                                             \
    void* f = next_export(next, #name);                                                  \
    return f ? reinterpret_cast<AsyncCopyFn>(f)(dst, src, n, s) : kNotFound;             \
  }
GS_COPY3(cuMemcpyHtoD_v2)
GS_COPY3(cuMemcpyHtoD_v2_ptds)
GS_COPY3(cuMemcpyDtoH_v2)
GS_COPY3(cuMemcpyDtoH_v2_ptds)
GS_COPY3(cuMemcpy)
GS_COPY3(cuMemcpy_ptds)
GS_COPY4(cuMemcpyHtoDAsync_v2)
GS_COPY4(cuMemcpyHtoDAsync_v2_ptsz)
GS_COPY4(cuMemcpyDtoHAsync_v2)
GS_COPY4(cuMemcpyDtoHAsync_v2_ptsz)
GS_COPY4(cuMemcpyAsync)
GS_COPY4(cuMemcpyAsync_ptsz)

// ---- start and end ----

namespace {

Mode mode_from_env() {
  const char* v = std::getenv("GPUSCOPE_PIN_MODE");
  if (!v || !*v || !std::strcmp(v, "online")) return Mode::online;
  if (!std::strcmp(v, "all")) return Mode::all;
  if (!std::strcmp(v, "off")) return Mode::off;
  say("GPUSCOPE_PIN_MODE=%s is not online, all or off: online", v);
  return Mode::online;
}

}  // namespace

__attribute__((constructor)) static void gs_pin_init() {
  gs_pin_real_dlsym = gpuscope::inject::next_dlsym();
  Lookup::real_dlsym = gs_pin_real_dlsym;
  Lookup::after = &after_lookup;
  g_real_usable_size = reinterpret_cast<size_t (*)(void*)>(dlvsym(RTLD_NEXT, "malloc_usable_size", "GLIBC_2.2.5"));
  fill_wrappers<0>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<1>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<2>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<3>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<4>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<5>(std::make_integer_sequence<int, kSlots>{});
  if (!gs_pin_real_dlsym || !g_real_usable_size) {
    say("the C library's dlsym or malloc_usable_size was not found: the program runs without pinning");
    return;
  }
  Inside inside;
  Settings settings;
  settings.mode = mode_from_env();
  settings.min_bytes = std::max<size_t>(env_bytes("GPUSCOPE_PIN_MIN_BYTES", settings.min_bytes), 4096);
  const size_t ram = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
  settings.cap_bytes = env_bytes("GPUSCOPE_PIN_CAP_BYTES", ram / 4);
  g_relaxed = std::getenv("GPUSCOPE_PIN_RELAXED") && !std::strcmp(std::getenv("GPUSCOPE_PIN_RELAXED"), "1");
  g_want_sites = settings.mode == Mode::online;
  gpuscope::advise::CopyModel model = gpuscope::advise::builtin_copy_model();
  if (const char* table = std::getenv("GPUSCOPE_PIN_COPY_TABLE"); table && *table) {
    try {
      model = gpuscope::advise::load_copy_model(table);
    } catch (const std::exception& e) {
      say("%s; using the built-in table", e.what());
    }
  }
  g_min_bytes = settings.min_bytes;
  Pinner* made = new (g_pinner_space) Pinner(settings, std::move(model), g_driver);
  read_profile(*made);
  g_pinner.store(made, std::memory_order_release);
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

__attribute__((destructor)) static void gs_pin_fini() {
  g_exiting.store(true, std::memory_order_relaxed);
  write_report();
  write_profile();
}
