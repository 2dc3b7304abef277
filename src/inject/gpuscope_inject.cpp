// libgpuscope_inject.so: loaded into a CUDA program by the driver (CUDA_INJECTION64_PATH) when
// `gpuscope record --gpu-times` runs it. It asks CUPTI's activity API for each kernel's, copy's
// and memset's start and end on the GPU, and for the API calls that made them, and writes them to
// GPUSCOPE_GPU_TRACE/gpu-PID.bin (src/inject/gpu_trace.h) for gpuscope to tie to its own calls.
//
// It must never break or block the program: CUPTI is loaded at run time (the program's own, found
// next to its libcudart, or the system's), and anything missing — no CUPTI, a CUPTI of another
// version, another CUPTI user (torch.profiler), an unwritable directory — leaves the program
// running without GPU times, with one line on stderr saying why.
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#include <cupti_version.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inject/gpu_trace.h"
#include "common/clock.h"

namespace {

using gpuscope::monotonic_ns;

struct Cupti {
  CUptiResult (*GetVersion)(uint32_t*);
  CUptiResult (*GetResultString)(CUptiResult, const char**);
  CUptiResult (*ActivityEnable)(CUpti_ActivityKind);
  CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*ActivityGetNextRecord)(uint8_t*, size_t, CUpti_Activity**);
  CUptiResult (*ActivityFlushAll)(uint32_t);
  CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t*);
  CUptiResult (*ActivityRegisterTimestampCallback)(CUpti_TimestampCallbackFunc);
  CUptiResult (*GetTimestamp)(uint64_t*);
  CUptiResult (*Subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
  CUptiResult (*Unsubscribe)(CUpti_SubscriberHandle);
  CUptiResult (*EnableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
  CUptiResult (*GetCallbackName)(CUpti_CallbackDomain, uint32_t, const char**);
};

Cupti g_cupti;
int g_fd = -1;
std::mutex g_write_mu;
std::atomic<bool> g_active{false};
std::atomic<uint64_t> g_written{0}, g_dropped{0};
uint64_t g_max_bytes = 4ull << 30;  // GPUSCOPE_GPU_TRACE_MAX_MB: past it, records are counted, not written
constexpr size_t kBufferSize = 8 << 20;

// API calls seen by CUPTI callbacks, waiting for the flush thread; bounded (past it, dropped).
std::mutex g_api_mu;
std::vector<gs_gpu_record> g_api;
constexpr size_t kMaxPendingApi = 1 << 18;  // 18 MiB; written every 100 ms
int64_t g_clock_offset_ns = 0;  // the header's: what CUPTI's clock lags gpuscope's by

void say(const char* fmt, const char* detail) {
  std::fprintf(stderr, "gpuscope: ");
  std::fprintf(stderr, fmt, detail);
  std::fprintf(stderr, "\n");
}


// The directory of the libcudart this program loaded: pip wheels ship libcupti beside it.
std::string cudart_directory() {
  std::string dir;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const char* name = info->dlpi_name;
        if (name && std::strstr(name, "libcudart.so")) {
          std::string path(name);
          *static_cast<std::string*>(out) = path.substr(0, path.rfind('/'));
          return 1;
        }
        return 0;
      },
      &dir);
  return dir;
}

void* open_cupti() {
  std::string tried;
  auto attempt = [&](const std::string& path) -> void* {
    if (path.empty()) return nullptr;
    tried += (tried.empty() ? "" : ", ") + path;
    return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  };
  // A CUPTI named by the user is the only one tried.
  if (const char* p = std::getenv("GPUSCOPE_CUPTI"); p && *p) {
    if (void* h = attempt(p)) return h;
    say("GPUSCOPE_CUPTI=%s could not be loaded: no GPU times", p);
    return nullptr;
  }
  if (auto dir = cudart_directory(); !dir.empty())
    for (const char* n : {"/libcupti.so.13", "/libcupti.so"})
      if (void* h = attempt(dir + n)) return h;
  for (const char* n : {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                        "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"})
    if (void* h = attempt(n)) return h;
  say("no CUPTI library could be loaded (tried %s): no GPU times", tried.c_str());
  return nullptr;
}

template <class F>
bool bind(void* h, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  return fn != nullptr;
}

const char* result_text(CUptiResult r) {
  const char* s = nullptr;
  if (g_cupti.GetResultString) g_cupti.GetResultString(r, &s);
  return s ? s : "unknown CUPTI error";
}

void write_all(const void* data, size_t n) {
  // Once the file reached its cap (or the disk is full), records are counted as dropped.
  if (g_fd < 0 || g_written.load() + n > g_max_bytes) {
    g_dropped += 1;
    return;
  }
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(g_fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      g_dropped += 1;
      return;
    }
    p += w;
    n -= size_t(w);
    g_written += uint64_t(w);
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferSize));
  *size = *buffer ? kBufferSize : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid) {
  std::string out;
  out.reserve(valid / 2);
  CUpti_Activity* rec = nullptr;
  while (g_cupti.ActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    gs_gpu_record r{};
    std::string name;
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        r.kind = GS_GPU_KERNEL;
        r.device = k->deviceId;
        r.start = k->start;
        r.end = k->end;
        r.stream = k->streamId;
        r.correlation = k->correlationId;
        r.grid[0] = uint32_t(k->gridX), r.grid[1] = uint32_t(k->gridY), r.grid[2] = uint32_t(k->gridZ);
        r.block[0] = uint32_t(k->blockX), r.block[1] = uint32_t(k->blockY), r.block[2] = uint32_t(k->blockZ);
        if (k->name) name = k->name;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        r.kind = GS_GPU_MEMCPY;
        r.detail = m->copyKind;
        r.device = m->deviceId;
        r.start = m->start;
        r.end = m->end;
        r.stream = m->streamId;
        r.correlation = m->correlationId;
        r.bytes = m->bytes;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        r.kind = GS_GPU_MEMSET;
        r.device = m->deviceId;
        r.start = m->start;
        r.end = m->end;
        r.stream = m->streamId;
        r.correlation = m->correlationId;
        r.bytes = m->bytes;
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
        r.kind = GS_GPU_API;
        r.detail = rec->kind == CUPTI_ACTIVITY_KIND_DRIVER;
        r.start = a->start;
        r.end = a->end;
        r.correlation = a->correlationId;
        r.bytes = a->cbid;
        r.thread = a->threadId;
        break;
      }
      default:
        continue;
    }
    r.name_len = uint32_t(name.size());
    out.append(reinterpret_cast<const char*>(&r), sizeof(r));
    out += name;
  }
  size_t dropped = 0;
  if (g_cupti.ActivityGetNumDroppedRecords && g_cupti.ActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS &&
      dropped) {
    gs_gpu_record d{};
    d.kind = GS_GPU_DROPPED;
    d.bytes = dropped;
    out.append(reinterpret_cast<const char*>(&d), sizeof(d));
  }
  {
    std::lock_guard lock(g_write_mu);
    write_all(out.data(), out.size());
  }
  std::free(buffer);
}

uint64_t CUPTIAPI timestamp() { return monotonic_ns(); }

uint32_t this_thread_id() {
  thread_local const uint32_t tid = uint32_t(syscall(SYS_gettid));
  return tid;
}

// The calls that make GPU work (launches, copies, memsets, graph launches), one record each at
// their exit: the correlation id CUPTI gives their activities, the thread and the call's span.
void CUPTIAPI on_api_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (!g_active.load(std::memory_order_relaxed)) return;  // not started, or flushed at exit
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  // In the file, times are on CUPTI's clock (the reader adds the offset).
  const uint64_t now = uint64_t(int64_t(monotonic_ns()) - g_clock_offset_ns);
  if (cb->callbackSite == CUPTI_API_ENTER) {
    *cb->correlationData = now;
    return;
  }
  gs_gpu_record r{};
  r.kind = GS_GPU_API;
  r.detail = domain == CUPTI_CB_DOMAIN_DRIVER_API;
  r.start = *cb->correlationData;
  r.end = now;
  r.correlation = cb->correlationId;
  r.bytes = cbid;
  r.thread = this_thread_id();
  std::lock_guard lock(g_api_mu);
  if (g_api.size() < kMaxPendingApi)
    g_api.push_back(r);
  else
    g_dropped += 1;
}

void write_pending_api_calls() {
  std::vector<gs_gpu_record> batch;
  {
    std::lock_guard lock(g_api_mu);
    batch.swap(g_api);
  }
  if (batch.empty()) return;
  std::lock_guard lock(g_write_mu);
  write_all(batch.data(), batch.size() * sizeof(gs_gpu_record));
}

bool makes_gpu_work(const char* name) {
  for (const char* prefix : {"cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch", "cuLaunch", "cuMemcpy",
                             "cuMemset", "cuGraphLaunch"})
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

// Callbacks on only the calls that make GPU work, in both domains (a launch through the runtime
// is tied by the runtime call's id; one straight to the driver, by the driver call's).
bool enable_api_callbacks(CUpti_SubscriberHandle sub) {
  Cupti& c = g_cupti;
  if (!c.EnableCallback || !c.GetCallbackName) return false;
  int enabled = 0;
  for (auto [domain, size] : {std::pair{CUPTI_CB_DOMAIN_RUNTIME_API, uint32_t(CUPTI_RUNTIME_TRACE_CBID_SIZE)},
                              std::pair{CUPTI_CB_DOMAIN_DRIVER_API, uint32_t(CUPTI_DRIVER_TRACE_CBID_SIZE)}})
    for (uint32_t cbid = 1; cbid < size; ++cbid) {
      const char* name = nullptr;
      if (c.GetCallbackName(domain, cbid, &name) == CUPTI_SUCCESS && name && makes_gpu_work(name) &&
          c.EnableCallback(1, sub, domain, cbid) == CUPTI_SUCCESS)
        ++enabled;
    }
  return enabled > 0;
}

void flush_at_exit() {
  if (!g_active.exchange(false)) return;
  g_cupti.ActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  write_pending_api_calls();
  std::lock_guard lock(g_write_mu);
  if (g_dropped.load()) {
    gs_gpu_record d{};
    d.kind = GS_GPU_DROPPED;
    d.bytes = g_dropped.load();
    g_dropped = 0;
    write_all(&d, sizeof(d));
  }
  if (g_fd >= 0) ::close(g_fd);
  g_fd = -1;
}

// API records tie each activity (by its correlation id) to the call that made it. By default they
// come from CUPTI callbacks on just the calls that make GPU work. CUPTI's runtime and driver API
// activities instead cost a callback on every API call (PyTorch makes several per launch).
// GPUSCOPE_CUPTI_API (a benchmark knob): callbacks (default) | runtime,driver (API activities) |
// driver | runtime | none.
std::string api_records_mode() {
  const char* e = std::getenv("GPUSCOPE_CUPTI_API");
  return e && *e ? e : "callbacks";
}

std::vector<CUpti_ActivityKind> activity_kinds(const std::string& api) {
  std::vector<CUpti_ActivityKind> kinds{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                        CUPTI_ACTIVITY_KIND_MEMSET};
  if (api.find("runtime") != std::string::npos) kinds.push_back(CUPTI_ACTIVITY_KIND_RUNTIME);
  if (api.find("driver") != std::string::npos) kinds.push_back(CUPTI_ACTIVITY_KIND_DRIVER);
  return kinds;
}

bool start() {
  const char* dir = std::getenv(GS_GPU_TRACE_ENV);
  if (!dir || !*dir) {
    say("%s is not set (gpuscope record --gpu-times sets it): no GPU times", GS_GPU_TRACE_ENV);
    return false;
  }
  if (const char* cap = std::getenv("GPUSCOPE_GPU_TRACE_MAX_MB")) g_max_bytes = std::strtoull(cap, nullptr, 10) << 20;
  void* h = open_cupti();
  if (!h) return false;
  Cupti& c = g_cupti;
  if (!bind(h, c.GetVersion, "cuptiGetVersion") || !bind(h, c.ActivityEnable, "cuptiActivityEnable") ||
      !bind(h, c.ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks") ||
      !bind(h, c.ActivityGetNextRecord, "cuptiActivityGetNextRecord") ||
      !bind(h, c.ActivityFlushAll, "cuptiActivityFlushAll")) {
    say("%s", "the CUPTI library found lacks the activity API: no GPU times");
    return false;
  }
  bind(h, c.GetResultString, "cuptiGetResultString");
  bind(h, c.ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords");
  bind(h, c.ActivityRegisterTimestampCallback, "cuptiActivityRegisterTimestampCallback");
  bind(h, c.GetTimestamp, "cuptiGetTimestamp");
  bind(h, c.Subscribe, "cuptiSubscribe");
  bind(h, c.Unsubscribe, "cuptiUnsubscribe");
  bind(h, c.EnableCallback, "cuptiEnableCallback");
  bind(h, c.GetCallbackName, "cuptiGetCallbackName");
  uint32_t version = 0;
  c.GetVersion(&version);
  // Records are read with this CUPTI's structure layouts: another major version would misread them.
  if (version / 1000 != CUPTI_API_VERSION / 1000 && version != CUPTI_API_VERSION) {
    char msg[128];
    std::snprintf(msg, sizeof(msg), "%u (gpuscope was built with %u)", version, unsigned(CUPTI_API_VERSION));
    say("CUPTI API version %s: no GPU times", msg);
    return false;
  }

  // A process has one CUPTI subscriber, and one pair of activity buffer callbacks, which the last
  // to register takes over. Holding the subscriber slot in every mode makes a profiler started
  // later (torch.profiler's Kineto, ...) fail its cuptiSubscribe and leave the buffers alone; a
  // tool that holds it already keeps it: gpuscope stands aside rather than fight it for them.
  CUpti_SubscriberHandle sub = nullptr;
  if (c.Subscribe) {
    const CUptiResult r = c.Subscribe(&sub, on_api_call, nullptr);
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
      say("%s", "another CUPTI user (a profiler or tracer) is already in this process: no GPU times");
      return false;
    }
    if (r != CUPTI_SUCCESS) sub = nullptr;
  }
  // Without GPU times the slot goes back, for a profiler that the program may start.
  struct Release {
    CUpti_SubscriberHandle sub;
    ~Release() {
      if (sub && g_cupti.Unsubscribe) g_cupti.Unsubscribe(sub);
    }
  } release{sub};

  gs_gpu_trace_header hdr{};
  std::memcpy(hdr.magic, GS_GPU_TRACE_MAGIC, sizeof(hdr.magic));
  hdr.pid = uint32_t(getpid());
  hdr.cupti_version = version;
  // Times on gpuscope's clock: given to CUPTI, or else measured against it once.
  // GPUSCOPE_CUPTI_CLOCK=cupti (a benchmark knob) keeps CUPTI's own clock and the offset.
  const char* clock = std::getenv("GPUSCOPE_CUPTI_CLOCK");
  const bool own_clock = clock && std::strcmp(clock, "cupti") == 0;
  if (own_clock || !c.ActivityRegisterTimestampCallback ||
      c.ActivityRegisterTimestampCallback(timestamp) != CUPTI_SUCCESS) {
    uint64_t cupti_now = 0;
    if (c.GetTimestamp && c.GetTimestamp(&cupti_now) == CUPTI_SUCCESS)
      hdr.clock_offset_ns = int64_t(monotonic_ns()) - int64_t(cupti_now);
  }
  g_clock_offset_ns = hdr.clock_offset_ns;
  if (CUptiResult r = c.ActivityRegisterCallbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS) {
    say("CUPTI refused its buffer callbacks (%s): no GPU times", result_text(r));
    return false;
  }
  std::string api = api_records_mode();
  const bool callbacks_refused = api == "callbacks" && !(sub && enable_api_callbacks(sub));
  if (callbacks_refused) api = "runtime,driver";
  for (CUpti_ActivityKind k : activity_kinds(api)) {
    if (CUptiResult r = c.ActivityEnable(k); r != CUPTI_SUCCESS) {
      // Typically another CUPTI user (a profiler) holds it.
      say("CUPTI would not record GPU activity (%s): no GPU times", result_text(r));
      return false;
    }
  }
  if (callbacks_refused)
    say("%s", "CUPTI refused callbacks: its API activity records tie GPU work instead (costs more per call)");
  const std::string path = std::string(dir) + "/gpu-" + std::to_string(getpid()) + ".bin";
  g_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (g_fd < 0) {
    say("cannot write %s: no GPU times", path.c_str());
    return false;
  }
  write_all(&hdr, sizeof(hdr));
  release.sub = nullptr;  // kept for the process's life
  g_active = true;
  std::atexit(flush_at_exit);
  // Completed buffers are handed over when full or flushed: flush once a second, so that a
  // program that never exits cleanly loses at most its last second.
  // API records are written every 100 ms, so that the calls' queue stays small.
  std::thread([] {
    for (unsigned tick = 1; g_active.load(); ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!g_active.load()) break;
      if (tick % 10 == 0) g_cupti.ActivityFlushAll(0);
      write_pending_api_calls();
    }
  }).detach();
  return true;
}

}  // namespace

// Called by the CUDA driver once, at cuInit, in the program's process. Returns 1: the program
// goes on whatever happens here.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      start();
    } catch (...) {
      say("%s", "GPU times failed to start");
    }
  });
  return 1;
}
