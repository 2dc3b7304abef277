// libgpuscope_launches.so: preloaded (LD_PRELOAD) into a program that `gpuscope record` starts, it
// collects the program's kernel and graph launches without a trap each (issue 33). Every launch
// of a CUDA program reaches the driver's entry points (cuLaunchKernel and its kin) through a
// pointer: the runtime, cuBLAS and cuDNN (each with its own copy of the runtime) and PyTorch's
// driver calls get theirs from cuGetProcAddress, which they find with dlsym on libcuda.so.1. This
// library interposes dlsym, hands out its own cuGetProcAddress, and that hands out wrappers of the
// launch entry points; programs that call the driver by symbol reach the wrappers exported here.
// Each wrapper calls the driver and writes one 64-byte record into a ring in shared memory
// (inject/launch_ring.h) that gpuscope drains: no system call, no lock. The first launch of each
// function also writes its name there. Preloaded by a service's owner rather than by gpuscope,
// the library keeps the ring in standby until a `gpuscope record --pid` claims it.
//
// It must never break or block the program: anything it cannot do (no ring directory, a full
// ring, a lookup it does not know) leaves the call as it was, counted.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "inject/driver_interpose.h"
#include "inject/launch_ring.h"
#include "inject/probe_marker.h"

// The C library's dlsym (this library defines its own, below).
extern "C" {
__attribute__((visibility("hidden"))) void* (*gs_launches_real_dlsym)(void*, const char*) = nullptr;
}

namespace {

// The driver's ABI, as cuda.h declares it (its macros rename entry points; these do not).
using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using CUgraphExec = void*;
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  CUstream hStream;
  void* attrs;
  unsigned numAttrs;
};
using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void**, void**);
using LaunchKernelExFn = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using LaunchCooperativeFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                         unsigned, CUstream, void**);
using GraphLaunchFn = CUresult (*)(CUgraphExec, CUstream);
using KernelGetFunctionFn = CUresult (*)(CUfunction*, void*);

constexpr CUresult kNotFound = 500;  // CUDA_ERROR_NOT_FOUND

// ---- the ring ----

struct Ring {
  gs_launch_ring_header* header = nullptr;
  gs_launch_record* slots = nullptr;
  uint64_t mask = 0;
  size_t bytes = 0;
};
Ring g_ring;
// 0: not tried, 1: being made, 2: ready, 3: none (no directory, or it failed: calls go on unrecorded).
std::atomic<int> g_ring_state{0};
std::atomic<uint64_t> g_unrecorded{0};  // launches while there was no ring
bool g_prefetch = true;  // GPUSCOPE_LAUNCH_PREFETCH=0 turns it off (a benchmark's switch)
bool g_ring_kept = false;  // in standby for a `record --pid` to claim (set before the ring is ready)

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

// The launches' clock, chosen at the first read (a library's constructor may launch before this
// one's runs): the TSC where the kernel keeps time with it (GS_LAUNCH_CLOCK_TSC), else
// CLOCK_MONOTONIC. GPUSCOPE_LAUNCH_CLOCK=monotonic keeps CLOCK_MONOTONIC.
bool kernel_clock_is_tsc() {
  if (const char* c = std::getenv("GPUSCOPE_LAUNCH_CLOCK"); c && !std::strcmp(c, "monotonic")) return false;
  const int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[16] = {};
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  return n >= 3 && !std::strncmp(buf, "tsc", 3) && (n == 3 || buf[3] == '\n');
}
std::atomic<int> g_clock{-1};  // GS_LAUNCH_CLOCK_*, -1 until chosen (racing choosers agree)
int launch_clock() {
  int c = g_clock.load(std::memory_order_relaxed);
  if (c < 0) g_clock.store(c = kernel_clock_is_tsc() ? int(GS_LAUNCH_CLOCK_TSC) : int(GS_LAUNCH_CLOCK_MONOTONIC));
  return c;
}
inline uint64_t now_ts() { return launch_clock() == int(GS_LAUNCH_CLOCK_TSC) ? __rdtsc() : now_ns(); }

// initial-exec: a preloaded library has static TLS, and its reads need no call.
__attribute__((tls_model("initial-exec"))) thread_local uint32_t t_tid = 0;
uint32_t thread_id() {
  if (!t_tid) t_tid = uint32_t(syscall(SYS_gettid));
  return t_tid;
}

uint32_t ring_slots() {
  uint32_t slots = GS_LAUNCH_RING_SLOTS_DEFAULT;
  if (const char* s = std::getenv("GPUSCOPE_LAUNCH_RING_SLOTS")) {
    const unsigned long v = std::strtoul(s, nullptr, 10);
    if (v >= 64 && v <= (1ul << 24) && (v & (v - 1)) == 0) slots = uint32_t(v);
  }
  return slots;
}

// Sends the ring's descriptor to gpuscope's socket in `dir` (SCM_RIGHTS). Retried for a few
// milliseconds while the socket's queue is full (many processes starting at once).
bool send_ring(const char* dir, int fd, pid_t pid) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s", dir, GS_LAUNCH_RING_SOCKET) >=
      int(sizeof addr.sun_path)) {
    errno = ENAMETOOLONG;
    return false;
  }
  const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return false;
  gs_launch_ring_hello hello{};
  std::memcpy(hello.magic, GS_LAUNCH_RING_MAGIC, sizeof hello.magic);
  hello.pid = uint32_t(pid);
  iovec iov{&hello, sizeof hello};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_name = &addr;
  msg.msg_namelen = sizeof addr;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  bool sent = false;
  for (int attempt = 0; attempt < 50 && !sent; ++attempt) {
    sent = sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(sizeof hello);
    if (!sent && errno != EAGAIN && errno != EINTR) break;
    if (!sent) {
      const timespec pause{0, 1'000'000};
      nanosleep(&pause, nullptr);
    }
  }
  const int saved = errno;
  close(sock);
  errno = saved;
  return sent;
}

// The ring is a sealed memfd: its size can never change under gpuscope's mapping. Without
// GPUSCOPE_LAUNCH_RING (a service the library was preloaded into by its owner) the process keeps
// it in standby (inject/launch_ring.h) for a `gpuscope record --pid` to claim.
void make_ring() {
  const char* dir = std::getenv(GS_LAUNCH_RING_ENV);
  const bool standby = !dir || !*dir;
  auto fail = [&](const char* what) {
    std::fprintf(stderr, "gpuscope: could not make the launch ring (%s: %s): this process's launches go unrecorded\n",
                 what, std::strerror(errno));
    g_ring_state.store(3, std::memory_order_release);
  };
  const uint32_t slots = ring_slots();
  const size_t names_at = sizeof(gs_launch_ring_header) + size_t(slots) * sizeof(gs_launch_record);
  const size_t bytes = names_at + GS_LAUNCH_NAMES_BYTES_DEFAULT;
  const int fd = memfd_create(GS_LAUNCH_RING_MEMFD, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail("memfd_create");
  void* mem = MAP_FAILED;
  if (ftruncate(fd, off_t(bytes)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      (mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    close(fd);
    return fail("memfd");
  }
  // The records' pages now, not at a launch (the names' pages as names come: few are).
  for (size_t at = 0; at < names_at; at += 4096) static_cast<volatile char*>(mem)[at] = 0;
  const pid_t pid = getpid();
  auto* h = static_cast<gs_launch_ring_header*>(mem);
  std::memcpy(h->magic, GS_LAUNCH_RING_MAGIC, sizeof h->magic);
  h->version = GS_LAUNCH_RING_VERSION;
  h->record_size = sizeof(gs_launch_record);
  h->slots = slots;
  h->pid = uint32_t(pid);
  h->created_ns = now_ns();
  h->names_offset = uint32_t(names_at);
  h->names_bytes = GS_LAUNCH_NAMES_BYTES_DEFAULT;
  if (const char* every = std::getenv(GS_LAUNCH_STACK_EVERY_ENV))
    h->stack_every = uint32_t(std::strtoul(every, nullptr, 10));
  h->clock = uint32_t(launch_clock());
  // Benchmarks start paused (bench/gpu/hooks_ab.py), then switch the hooks on and off.
  if (const char* p = std::getenv("GPUSCOPE_LAUNCH_PAUSED")) h->paused = std::strtoul(p, nullptr, 10) != 0;
  if (standby) h->paused = 1;
  // Handed to gpuscope, which holds it from then on: a process that ends, however it ends,
  // leaves its ring readable. The process keeps only the mapping (which is how a later
  // gpuscope finds a ring in standby).
  const bool sent = standby || send_ring(dir, fd, pid);
  close(fd);
  if (!sent) {
    munmap(mem, bytes);
    return fail("handing it to gpuscope");
  }
  g_ring = {h, reinterpret_cast<gs_launch_record*>(h + 1), uint64_t(slots) - 1, bytes};
  g_ring_kept = standby;
  g_ring_state.store(2, std::memory_order_release);
  // Launches that came while it was being made (a thread that waited too long) count as lost.
  __atomic_fetch_add(&h->lost, g_unrecorded.exchange(0), __ATOMIC_RELAXED);
}

// The ring, made at the first launch of this process (a process that never launches has none).
gs_launch_ring_header* ring() {
  int s = g_ring_state.load(std::memory_order_acquire);
  if (s == 2) return g_ring.header;
  if (s == 0 && g_ring_state.compare_exchange_strong(s, 1, std::memory_order_acq_rel)) {
    make_ring();
    s = g_ring_state.load(std::memory_order_acquire);
  }
  // Another thread is making it (a few system calls): waited for, a little.
  for (int i = 0; s == 1 && i < 10000; ++i) {
    sched_yield();
    s = g_ring_state.load(std::memory_order_acquire);
  }
  return s == 2 ? g_ring.header : nullptr;
}

// The functions whose names are in the ring (at most one thread names each): an open-addressing
// set of CUfunctions, looked at on every launch.
constexpr int kNamedBits = 14;
constexpr uint32_t kNamedMask = (1u << kNamedBits) - 1;
std::atomic<uint64_t> g_named[1u << kNamedBits];
void name_function(gs_launch_ring_header* h, void* f);  // below: it needs the driver

// Appends `f`'s name to the ring the first time `f` is launched. A set too full near `f`'s place
// leaves it unnamed (gpuscope names it as it would without the ring, where it can).
inline void name_once(gs_launch_ring_header* h, void* f) {
  if (!h || !f) return;
  const uint64_t key = uint64_t(f);
  uint32_t i = uint32_t((key * 0x9E3779B97F4A7C15ull) >> (64 - kNamedBits));
  for (int probe = 0; probe < 32; ++probe, i = (i + 1) & kNamedMask) {
    uint64_t k = g_named[i].load(std::memory_order_relaxed);
    if (k == key) return;
    if (k == 0 && (g_named[i].compare_exchange_strong(k, key, std::memory_order_relaxed) || k == key)) {
      if (k == 0) name_function(h, f);
      return;
    }
  }
}

void write_name(gs_launch_ring_header* h, void* f, const char* name) {
  const uint32_t length = uint32_t(strnlen(name, GS_LAUNCH_NAME_MAX));
  const uint64_t size = GS_LAUNCH_NAME_SIZE(length);
  const uint64_t at = __atomic_fetch_add(&h->names_head, size, __ATOMIC_RELAXED);
  if (at + size > h->names_bytes) {
    __atomic_fetch_add(&h->names_lost, 1, __ATOMIC_RELAXED);
    return;
  }
  auto* e = reinterpret_cast<gs_launch_name*>(reinterpret_cast<char*>(h) + h->names_offset + at);
  e->function = uint64_t(f);
  e->length = length;
  std::memcpy(e->name, name, length);
  e->name[length] = 0;
  __atomic_store_n(&e->ready, 1u, __ATOMIC_RELEASE);
}

// A forked child writes into a ring of its own, made at its first launch; the parent's stays the
// parent's. Only the forking thread lives on in the child.
void after_fork_in_child() {
  for (auto& k : g_named) k.store(0, std::memory_order_relaxed);  // the child's ring has no names yet
  if (g_ring_state.load() == 2) munmap(g_ring.header, g_ring.bytes);
  g_ring = {};
  g_ring_kept = false;
  g_ring_state.store(0);
  t_tid = 0;
}

struct Launch {
  uint16_t api;
  uint16_t flags;
  uint64_t ts_ns, end_ns;
  void* function;
  CUstream stream;
  unsigned grid[3], block[3], shared_mem;
  CUresult result;
};

uint16_t clamp16(unsigned v) { return v > 0xffff ? 0xffff : uint16_t(v); }

void fill(gs_launch_record& r, const Launch& l, uint16_t flags) {
  r.ts_ns = l.ts_ns;
  r.function = uint64_t(l.function);
  r.stream = uint64_t(l.stream);
  r.tid = thread_id();
  r.grid_x = l.grid[0];
  r.grid_y = clamp16(l.grid[1]);
  r.grid_z = clamp16(l.grid[2]);
  r.block_x = clamp16(l.block[0]);
  r.block_y = clamp16(l.block[1]);
  r.block_z = clamp16(l.block[2]);
  r.api = l.api;
  r.shared_mem = l.shared_mem;
  const uint64_t d = l.end_ns - l.ts_ns;
  r.duration_ns = d > 0xffffffffull ? 0xffffffffu : uint32_t(d);
  r.result = uint16_t(l.result);
  r.flags = flags;
}

// Whether this launch is the one in `every` whose stack is taken (a per-thread xorshift: no lock,
// no system call).
__attribute__((tls_model("initial-exec"))) thread_local uint64_t t_random = 0;
bool chosen(uint32_t every) {
  if (every <= 1) return true;
  uint64_t x = t_random ? t_random : (uint64_t(thread_id()) << 32 | 0x9e3779b9u) ^ now_ns();
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  t_random = x;
  return (x >> 11) % every == 0;
}

}  // namespace

// A launch whose stack is wanted: gpuscope probes gpuscope_launch_stack(const gs_launch_record*
// r, uint32_t every), walks the stack from there and records the launch `r` with it, standing for
// `every` launches. It does nothing itself (probe_marker.h).
extern "C" void gpuscope_launch_stack(const gs_launch_record* r, uint32_t every);
GS_PROBE_MARKER(gpuscope_launch_stack, "");


namespace {

// A ring kept here, claimed by a gpuscope that was killed before it could give it back, goes
// back to standby: looked at every 65,536 launches the ring could not hold (it fills once nobody
// reads it) or a thread handed over for their stacks (to a probe that is gone).
__attribute__((tls_model("initial-exec"))) thread_local uint32_t t_handed = 0;
void standby_if_reader_gone(gs_launch_ring_header* h) {
  if (!g_ring_kept) return;
  const uint32_t reader = __atomic_load_n(&h->reader_pid, __ATOMIC_RELAXED);
  const int saved = errno;  // the program's
  if (reader && kill(pid_t(reader), 0) != 0 && errno == ESRCH) {
    __atomic_store_n(&h->paused, 1u, __ATOMIC_RELAXED);
    uint32_t expected = reader;
    __atomic_compare_exchange_n(&h->reader_pid, &expected, 0u, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  }
  errno = saved;
}

// `stacked`: a launch, one in stack_every of which goes to gpuscope_launch_stack for its stack.
void write(const Launch& l, bool stacked = true) {
  gs_launch_ring_header* h = ring();
  if (!h) {
    g_unrecorded.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint32_t every = stacked ? __atomic_load_n(&h->stack_every, __ATOMIC_RELAXED) : 0;
  if (every && chosen(every)) {
    gs_launch_record r{};
    fill(r, l, l.flags);
    gpuscope_launch_stack(&r, every);
    if ((++t_handed & 0xffff) == 0) standby_if_reader_gone(h);
    return;
  }
  uint64_t pos = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
  do {
    // Signed: a `pos` read before the reader moved the tail past it is behind the tail, not full
    // (the compare-and-swap then fails and reads the head again).
    if (int64_t(pos - __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE)) >= int64_t(h->slots)) {
      if ((__atomic_fetch_add(&h->lost, 1, __ATOMIC_RELAXED) & 0xffff) == 0xffff) standby_if_reader_gone(h);
      return;
    }
  } while (!__atomic_compare_exchange_n(&h->head, &pos, pos + 1, true, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
  gs_launch_record& r = g_ring.slots[pos & g_ring.mask];
  fill(r, l, uint16_t(l.flags | (every ? GS_LAUNCH_STACK_LEFT_OUT : 0)));
  __atomic_store_n(&r.seq, pos + 1, __ATOMIC_RELEASE);
  // The next launches' slots, fetched for writing now: the reader's core read them last (a
  // lap ago), and the driver's launch in between evicts what it can.
  if (g_prefetch) {
    __builtin_prefetch(&g_ring.slots[(pos + 1) & g_ring.mask], 1, 3);
    __builtin_prefetch(&g_ring.slots[(pos + 2) & g_ring.mask], 1, 3);
  }
}

// ---- the driver's entry points ----

void* g_libcuda = nullptr;

// Each hooked entry point's real address and variants. A wrapper serves one real address; up to
// kSlots addresses per entry point (cuGetProcAddress may hand out a version per CUDA version asked).
constexpr int kSlots = 4;
struct Hook {
  const char* symbol;      // as cuGetProcAddress is asked for it
  uint16_t api, api_ptsz;  // gs_launch_api of the legacy-stream and per-thread variants
  // Slot S serves slots.real[S], a gs_launch_api of apis[S] (written before real[S] is published).
  gpuscope::inject::Slots<kSlots> slots;
  uint16_t apis[kSlots];
};

Hook g_hooks[] = {
    {"cuLaunchKernel", GS_LAUNCH_CU_LAUNCH_KERNEL, GS_LAUNCH_CU_LAUNCH_KERNEL_PTSZ, {}, {}},
    {"cuLaunchKernelEx", GS_LAUNCH_CU_LAUNCH_KERNEL_EX, GS_LAUNCH_CU_LAUNCH_KERNEL_EX_PTSZ, {}, {}},
    {"cuLaunchCooperativeKernel", GS_LAUNCH_CU_LAUNCH_COOPERATIVE_KERNEL, GS_LAUNCH_CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
     {}, {}},
    {"cuGraphLaunch", GS_LAUNCH_CU_GRAPH_LAUNCH, GS_LAUNCH_CU_GRAPH_LAUNCH_PTSZ, {}, {}},
    {"cuKernelGetFunction", GS_LAUNCH_CU_KERNEL_GET_FUNCTION, GS_LAUNCH_CU_KERNEL_GET_FUNCTION, {}, {}},
};
constexpr int kLaunchKernel = 0, kLaunchKernelEx = 1, kLaunchCooperative = 2, kGraphLaunch = 3,
              kKernelGetFunction = 4;
constexpr int kHooks = sizeof(g_hooks) / sizeof(g_hooks[0]);

// The ring header's `paused` (a benchmark's switch, or a ring in standby): launches go straight
// to the driver. Their functions are named all the same.
inline bool paused() {
  return g_ring_state.load(std::memory_order_acquire) == 2 && __atomic_load_n(&g_ring.header->paused, __ATOMIC_RELAXED);
}
// A ring kept in this process (not handed to gpuscope), paused with no reader: in standby,
// where nothing but names is written.
inline bool standing_by() {
  return g_ring_kept && paused() && !__atomic_load_n(&g_ring.header->reader_pid, __ATOMIC_RELAXED);
}

// The launch, timed, then written. `real`: the driver's entry point.
CUresult launch_kernel(void* real, uint16_t api, uint16_t via, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                       unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
  if (!real) return kNotFound;
  name_once(ring(), f);
  if (paused()) return reinterpret_cast<LaunchKernelFn>(real)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  const uint64_t t0 = now_ts();
  const CUresult r = reinterpret_cast<LaunchKernelFn>(real)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  write({api, via, t0, now_ts(), f, s, {gx, gy, gz}, {bx, by, bz}, shmem, r});
  return r;
}
CUresult launch_kernel_ex(void* real, uint16_t api, uint16_t via, const CUlaunchConfig* c, CUfunction f,
                          void** params, void** extra) {
  if (!real) return kNotFound;
  name_once(ring(), f);
  if (paused()) return reinterpret_cast<LaunchKernelExFn>(real)(c, f, params, extra);
  const uint64_t t0 = now_ts();
  const CUresult r = reinterpret_cast<LaunchKernelExFn>(real)(c, f, params, extra);
  Launch l{api, via, t0, now_ts(), f, nullptr, {}, {}, 0, r};
  if (c) {
    l.stream = c->hStream;
    l.grid[0] = c->gridDimX, l.grid[1] = c->gridDimY, l.grid[2] = c->gridDimZ;
    l.block[0] = c->blockDimX, l.block[1] = c->blockDimY, l.block[2] = c->blockDimZ;
    l.shared_mem = c->sharedMemBytes;
  }
  write(l);
  return r;
}
CUresult launch_cooperative(void* real, uint16_t api, uint16_t via, CUfunction f, unsigned gx, unsigned gy,
                            unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream s,
                            void** params) {
  if (!real) return kNotFound;
  name_once(ring(), f);
  if (paused()) return reinterpret_cast<LaunchCooperativeFn>(real)(f, gx, gy, gz, bx, by, bz, shmem, s, params);
  const uint64_t t0 = now_ts();
  const CUresult r = reinterpret_cast<LaunchCooperativeFn>(real)(f, gx, gy, gz, bx, by, bz, shmem, s, params);
  write({api, via, t0, now_ts(), f, s, {gx, gy, gz}, {bx, by, bz}, shmem, r});
  return r;
}
CUresult graph_launch(void* real, uint16_t api, uint16_t via, CUgraphExec g, CUstream s) {
  if (!real) return kNotFound;
  if (paused()) return reinterpret_cast<GraphLaunchFn>(real)(g, s);
  const uint64_t t0 = now_ts();
  const CUresult r = reinterpret_cast<GraphLaunchFn>(real)(g, s);
  write({api, via, t0, now_ts(), g, s, {}, {}, 0, r});
  return r;
}

// A kernel's function, written as a record of its own: a launch of that function is then named
// as the kernel (the probe on cuKernelGetFunction read it at the thread's next launch, which no
// longer traps).
CUresult kernel_get_function(void* real, uint16_t via, CUfunction* out, void* kernel) {
  if (!real) return kNotFound;
  const uint64_t t0 = now_ts();
  const CUresult r = reinterpret_cast<KernelGetFunctionFn>(real)(out, kernel);
  if (standing_by()) return r;
  write({GS_LAUNCH_CU_KERNEL_GET_FUNCTION, via, t0, now_ts(), kernel, r == 0 && out ? CUstream(*out) : nullptr, {}, {},
         0, r},
        false);
  return r;
}

// The wrappers cuGetProcAddress and dlsym hand out: hook H's slot S.
template <int H, int S>
struct Wrap;
template <int S>
struct Wrap<kLaunchKernel, S> {
  static CUresult call(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, CUstream s, void** params, void** extra) {
    void* real = g_hooks[kLaunchKernel].slots.real[S].load(std::memory_order_acquire);
    const uint16_t api = g_hooks[kLaunchKernel].apis[S];
    return launch_kernel(real, api, GS_LAUNCH_VIA_PROC_ADDRESS, f, gx, gy, gz, bx, by, bz,
                         shmem, s, params, extra);
  }
};
template <int S>
struct Wrap<kLaunchKernelEx, S> {
  static CUresult call(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    void* real = g_hooks[kLaunchKernelEx].slots.real[S].load(std::memory_order_acquire);
    const uint16_t api = g_hooks[kLaunchKernelEx].apis[S];
    return launch_kernel_ex(real, api, GS_LAUNCH_VIA_PROC_ADDRESS, c, f, params, extra);
  }
};
template <int S>
struct Wrap<kLaunchCooperative, S> {
  static CUresult call(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, CUstream s, void** params) {
    void* real = g_hooks[kLaunchCooperative].slots.real[S].load(std::memory_order_acquire);
    const uint16_t api = g_hooks[kLaunchCooperative].apis[S];
    return launch_cooperative(real, api, GS_LAUNCH_VIA_PROC_ADDRESS, f, gx, gy, gz, bx,
                              by, bz, shmem, s, params);
  }
};
template <int S>
struct Wrap<kGraphLaunch, S> {
  static CUresult call(CUgraphExec g, CUstream s) {
    void* real = g_hooks[kGraphLaunch].slots.real[S].load(std::memory_order_acquire);
    const uint16_t api = g_hooks[kGraphLaunch].apis[S];
    return graph_launch(real, api, GS_LAUNCH_VIA_PROC_ADDRESS, g, s);
  }
};

template <int S>
struct Wrap<kKernelGetFunction, S> {
  static CUresult call(CUfunction* out, void* kernel) {
    return kernel_get_function(g_hooks[kKernelGetFunction].slots.real[S].load(std::memory_order_acquire),
                               GS_LAUNCH_VIA_PROC_ADDRESS, out, kernel);
  }
};

template <int H, int... S>
void fill_wrappers(std::integer_sequence<int, S...>) {
  ((g_hooks[H].slots.wrappers[S] = reinterpret_cast<void*>(&Wrap<H, S>::call)), ...);
}

bool is_ours(void* address) {
  return gpuscope::inject::in_library_of(reinterpret_cast<const void*>(&launch_kernel), address);
}

void* open_libcuda() {
  if (!g_libcuda) g_libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return g_libcuda;
}

// The driver's name for a launched function, written into the ring: cuFuncGetName, or for a
// CUkernel (which the runtime of CUDA 12 and later passes to cuLaunchKernel in place of a function,
// its kernels being loaded as a library's) cuKernelGetName; both CUDA 12.3 on. A driver without
// them names nothing: gpuscope names kernels as it would without the ring.
using GetNameFn = CUresult (*)(const char**, void*);
GetNameFn driver_function(const char* symbol) {
  return open_libcuda() && gs_launches_real_dlsym
             ? reinterpret_cast<GetNameFn>(gs_launches_real_dlsym(g_libcuda, symbol))
             : nullptr;
}
void name_function(gs_launch_ring_header* h, void* f) {
  static std::atomic<bool> looked{false};
  static std::atomic<GetNameFn> func_name{nullptr}, kernel_name{nullptr};
  if (!looked.load(std::memory_order_acquire)) {
    func_name.store(driver_function("cuFuncGetName"), std::memory_order_relaxed);
    kernel_name.store(driver_function("cuKernelGetName"), std::memory_order_relaxed);
    looked.store(true, std::memory_order_release);
  }
  const GetNameFn by_function = func_name.load(std::memory_order_relaxed);
  const GetNameFn by_kernel = kernel_name.load(std::memory_order_relaxed);
  const char* name = nullptr;
  if ((by_function && by_function(&name, f) == 0 && name && *name) ||
      (by_kernel && by_kernel(&name, f) == 0 && name && *name))
    write_name(h, f, name);
}

// The wrapper to hand out for `real`, an address of hook `h` (real itself when all slots serve
// other addresses).
void* wrapper_for(int h, void* real) {
  Hook& k = g_hooks[h];
  return k.slots.wrapper_for(real, [&](int s) {
    // The per-thread variant is libcuda's exported _ptsz function.
    char name[96];
    std::snprintf(name, sizeof name, "%s_ptsz", k.symbol);
    void* ptsz = open_libcuda() && gs_launches_real_dlsym ? gs_launches_real_dlsym(g_libcuda, name) : nullptr;
    k.apis[s] = ptsz == real ? k.api_ptsz : k.api;
  });
}

int hook_index(const char* symbol) {
  for (int h = 0; h < kHooks; ++h)
    if (!std::strcmp(symbol, g_hooks[h].symbol)) return h;
  return -1;
}

// The hook for an exported name (cuLaunchKernel_ptsz is cuLaunchKernel's), or -1.
int hook_of_export(const char* name) {
  for (int h = 0; h < kHooks; ++h) {
    const size_t n = std::strlen(g_hooks[h].symbol);
    if (!std::strncmp(name, g_hooks[h].symbol, n) && (!name[n] || !std::strcmp(name + n, "_ptsz"))) return h;
  }
  return -1;
}

struct LaunchesTag;
using Lookup = gpuscope::inject::ProcAddress<LaunchesTag>;

// What the driver's cuGetProcAddress hands out, with launch entry points swapped for wrappers.
int after_lookup(int r, const char* symbol, void** pfn) {
  ring();  // made before the first launch through what is handed out
  // This library's export comes back where the driver's table points at the global symbol: it
  // records its calls itself.
  if (const int h = hook_index(symbol); h >= 0 && !is_ours(*pfn)) *pfn = wrapper_for(h, *pfn);
  return r;
}

void init_real_dlsym() {
  if (gs_launches_real_dlsym) return;
  gs_launches_real_dlsym = gpuscope::inject::next_dlsym();
  Lookup::real_dlsym = gs_launches_real_dlsym;
  Lookup::after = &after_lookup;
}

}  // namespace

// Called by dlsym before the C library's: the address to return instead of the C library's
// answer, or null to let it answer (then it runs as if called by dlsym's caller).
extern "C" __attribute__((visibility("hidden"))) void* gs_launches_dlsym_filter(void* handle, const char* name) {
  init_real_dlsym();
  if (!gs_launches_real_dlsym || !name || name[0] != 'c' || name[1] != 'u') return nullptr;
  if (void* stand_in = Lookup::for_dlsym(handle, name)) {
    Lookup::libcuda = open_libcuda();
    return stand_in;
  }
  const int h = hook_of_export(name);
  if (h < 0) return nullptr;
  void* real = gs_launches_real_dlsym(handle, name);
  // Not found, or found here (this library's export comes first in the global scope): as it is.
  if (!real || is_ours(real)) return nullptr;
  open_libcuda();
  return wrapper_for(h, real);
}
GS_DLSYM_TRAMPOLINE(gs_launches_dlsym_filter, gs_launches_real_dlsym);


// Calls bound to the symbols (a program or library linked against libcuda): the preload's
// definitions come first, and call the one the caller would have reached without this library.
// That is the next in the global scope (libcuda, or another preloaded shim that wraps it),
// else the one the caller's own object sees: itself or its dependencies (a library opened
// RTLD_LOCAL with libcuda among its dependencies, as Python opens extension modules; or one that
// defines the function itself).
namespace {
void* next_global(const char* name) {
  init_real_dlsym();
  if (!gs_launches_real_dlsym) return nullptr;
  void* real = gs_launches_real_dlsym(RTLD_NEXT, name);
  return real && !is_ours(real) ? real : nullptr;
}

void* caller_definition(const char* name, void* ret) {
  Dl_info info{};
  if (!gs_launches_real_dlsym || !dladdr(ret, &info) || !info.dli_fname || !*info.dli_fname) return nullptr;
  void* h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return nullptr;
  void* real = gs_launches_real_dlsym(h, name);
  dlclose(h);
  return real && !is_ours(real) ? real : nullptr;
}

// Per call site (its return address), what caller_definition found: a few sites an entry point.
struct Site {
  std::atomic<uintptr_t> ret{0};
  std::atomic<void*> real{nullptr};
};
constexpr int kSites = 8;
void* site_definition(Site* sites, const char* name, void* ret) {
  const uintptr_t key = uintptr_t(ret);
  Site& s = sites[(key >> 4) % kSites];
  if (s.ret.load(std::memory_order_acquire) == key) {
    void* real = s.real.load(std::memory_order_acquire);
    if (s.ret.load(std::memory_order_acquire) == key) return real;
  }
  void* real = caller_definition(name, ret);
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  s.ret.store(0, std::memory_order_release);
  s.real.store(real, std::memory_order_release);
  s.ret.store(key, std::memory_order_release);
  pthread_mutex_unlock(&mu);
  return real;
}

void* next_for(std::atomic<void*>& global, Site* sites, const char* name, void* ret) {
  void* real = global.load(std::memory_order_relaxed);
  if (real) return real;
  // Looked up again while none is there: libcuda may be opened globally later.
  if ((real = next_global(name))) {
    global.store(real, std::memory_order_relaxed);
    return real;
  }
  return site_definition(sites, name, ret);
}
}  // namespace

#define GS_EXPORT extern "C" __attribute__((visibility("default")))
#define GS_NEXT(name)                                                                                  \
  static std::atomic<void*> global_next{nullptr};                                                      \
  static Site sites[kSites];                                                                           \
  void* const real = next_for(global_next, sites, #name, __builtin_return_address(0));                \
  constexpr uint16_t via = GS_LAUNCH_VIA_SYMBOL

GS_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
  GS_NEXT(cuLaunchKernel);
  return launch_kernel(real, GS_LAUNCH_CU_LAUNCH_KERNEL, via, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
GS_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                       unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
  GS_NEXT(cuLaunchKernel_ptsz);
  return launch_kernel(real, GS_LAUNCH_CU_LAUNCH_KERNEL_PTSZ, via, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
GS_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  GS_NEXT(cuLaunchKernelEx);
  return launch_kernel_ex(real, GS_LAUNCH_CU_LAUNCH_KERNEL_EX, via, c, f, params, extra);
}
GS_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  GS_NEXT(cuLaunchKernelEx_ptsz);
  return launch_kernel_ex(real, GS_LAUNCH_CU_LAUNCH_KERNEL_EX_PTSZ, via, c, f, params, extra);
}
GS_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shmem, CUstream s, void** params) {
  GS_NEXT(cuLaunchCooperativeKernel);
  return launch_cooperative(real, GS_LAUNCH_CU_LAUNCH_COOPERATIVE_KERNEL, via, f, gx, gy, gz, bx, by, bz, shmem, s,
                            params);
}
GS_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                  unsigned by, unsigned bz, unsigned shmem, CUstream s, void** params) {
  GS_NEXT(cuLaunchCooperativeKernel_ptsz);
  return launch_cooperative(real, GS_LAUNCH_CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ, via, f, gx, gy, gz, bx, by, bz, shmem,
                            s, params);
}
GS_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
  GS_NEXT(cuGraphLaunch);
  return graph_launch(real, GS_LAUNCH_CU_GRAPH_LAUNCH, via, g, s);
}
GS_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
  GS_NEXT(cuGraphLaunch_ptsz);
  return graph_launch(real, GS_LAUNCH_CU_GRAPH_LAUNCH_PTSZ, via, g, s);
}

GS_EXPORT CUresult cuKernelGetFunction(CUfunction* out, void* kernel) {
  GS_NEXT(cuKernelGetFunction);
  return kernel_get_function(real, via, out, kernel);
}

__attribute__((constructor)) static void gs_launches_init() {
  init_real_dlsym();
  if (const char* p = std::getenv("GPUSCOPE_LAUNCH_PREFETCH")) g_prefetch = std::strcmp(p, "0") != 0;
  launch_clock();
  fill_wrappers<kLaunchKernel>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<kLaunchKernelEx>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<kLaunchCooperative>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<kGraphLaunch>(std::make_integer_sequence<int, kSlots>{});
  fill_wrappers<kKernelGetFunction>(std::make_integer_sequence<int, kSlots>{});
  pthread_atfork(nullptr, nullptr, after_fork_in_child);
}
