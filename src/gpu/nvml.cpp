#include "gpu/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/thread_name.h"

namespace gpuscope::gpu {
namespace {

// The part of nvml.h gpuscope uses: types and constants as the NVML API defines them.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
using nvmlEventSet_t = void*;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
constexpr nvmlReturn_t NVML_ERROR_NO_PERMISSION = 4;
constexpr nvmlReturn_t NVML_ERROR_NOT_FOUND = 6;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
constexpr nvmlReturn_t NVML_ERROR_TIMEOUT = 10;
constexpr int NVML_TEMPERATURE_GPU = 0;
constexpr int NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2;
constexpr int NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1;
constexpr int NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1;
constexpr int NVML_VOLATILE_ECC = 0;
constexpr unsigned long long nvmlEventTypeXidCriticalError = 0x8;

struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
// v2 tells the driver's reservation apart from what is used (v1's `used` includes it; nvidia-smi
// shows v2's).
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
constexpr unsigned int kMemoryV2 = sizeof(nvmlMemory_v2_t) | (2u << 24);
struct nvmlProcessUtilizationSample_t {
  unsigned int pid;
  unsigned long long timeStamp;
  unsigned int smUtil, memUtil, encUtil, decUtil;
};
struct nvmlProcessInfo_t {  // _v2/_v3 layout
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
};

constexpr unsigned long long kNotAvailable = ~0ull;  // NVML's "unknown" for a process's memory

// GPM, the GPU's performance counters through NVML (Hopper and later): two samples, then the
// metrics between them.
using nvmlGpmSample_t = void*;
struct nvmlGpmSupport_t {
  unsigned int version, isSupportedDevice;
};
constexpr unsigned int kGpmSupportVersion = 1, kGpmMetricsGetVersion = 1;
struct nvmlGpmMetric_t {
  unsigned int metricId;
  nvmlReturn_t nvmlReturn;
  double value;
  struct {
    char *shortName, *longName, *unit;
  } metricInfo;
};
// nvml.h sizes metrics[] by NVML_GPM_METRIC_MAX, which grows with each release (98, 210, 333):
// the library reads the first numMetrics entries only.
struct nvmlGpmMetricsGet_t {
  unsigned int version, numMetrics;
  nvmlGpmSample_t sample1, sample2;
  nvmlGpmMetric_t metrics[333];
};
enum GpmMetricId : unsigned int {
  NVML_GPM_METRIC_SM_UTIL = 2, NVML_GPM_METRIC_SM_OCCUPANCY = 3, NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5,
  NVML_GPM_METRIC_DRAM_BW_UTIL = 10,
};


// Metrics that NVML may not offer on a GPU; asked once, then skipped.
enum Metric : uint32_t {
  kUtil = 1 << 0, kMemory = 1 << 1, kPower = 1 << 2, kTemp = 1 << 3, kSmClock = 1 << 4, kMemClock = 1 << 5,
  kThrottle = 1 << 6, kPcieTx = 1 << 7, kPcieRx = 1 << 8, kEccCorrected = 1 << 9, kEccUncorrected = 1 << 10,
  kProcUtil = 1 << 11, kProcMemory = 1 << 12, kMemoryV2Bit = 1 << 13, kGpm = 1 << 14,
};

}  // namespace

class NvmlLibrary {
 public:
  explicit NvmlLibrary(void* handle) : handle_(handle) {}
  ~NvmlLibrary() {
    for (auto& g : gpm)
      for (auto& sample : g.samples)
        if (sample && GpmSampleFree) GpmSampleFree(sample);
    if (event_set_ && EventSetFree) EventSetFree(event_set_);
    if (Shutdown) Shutdown();
    dlclose(handle_);
  }

  // Every function gpuscope calls; the required ones fail the load when missing.
  template <class F>
  bool bind(F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(handle_, name));
    return fn != nullptr;
  }

  void* handle_;
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*SystemGetDriverVersion)(char*, unsigned int) = nullptr;
  nvmlReturn_t (*DeviceGetCount)(unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetHandleByIndex)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*DeviceGetName)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*DeviceGetUUID)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*DeviceGetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  nvmlReturn_t (*DeviceGetPowerUsage)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetEnforcedPowerLimit)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetTemperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetClockInfo)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetCurrentClocksThrottleReasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*DeviceGetPcieThroughput)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetTotalEccErrors)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*DeviceGetProcessUtilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t*, unsigned int*,
                                              unsigned long long) = nullptr;
  nvmlReturn_t (*DeviceGetComputeRunningProcesses)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*EventSetCreate)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*EventSetFree)(nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*DeviceRegisterEvents)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*EventSetWait)(nvmlEventSet_t, nvmlEventData_t*, unsigned int) = nullptr;
  nvmlReturn_t (*GpmQueryDeviceSupport)(nvmlDevice_t, nvmlGpmSupport_t*) = nullptr;
  nvmlReturn_t (*GpmSampleAlloc)(nvmlGpmSample_t*) = nullptr;
  nvmlReturn_t (*GpmSampleFree)(nvmlGpmSample_t) = nullptr;
  nvmlReturn_t (*GpmSampleGet)(nvmlDevice_t, nvmlGpmSample_t) = nullptr;
  nvmlReturn_t (*GpmMetricsGet)(nvmlGpmMetricsGet_t*) = nullptr;

  // Per device: the last GPM sample and the one the next tick fills; none where the GPU has no GPM.
  struct Gpm {
    nvmlGpmSample_t samples[2] = {nullptr, nullptr};
    int next = 0;
    bool primed = false;  // samples[next ^ 1] holds the last tick's
  };
  std::vector<Gpm> gpm;
  std::vector<nvmlDevice_t> handles;
  nvmlEventSet_t event_set_ = nullptr;

  std::string error_text(nvmlReturn_t r) const {
    const char* s = ErrorString ? ErrorString(r) : nullptr;
    return s ? std::string(s) : "NVML error " + std::to_string(r);
  }
};

std::vector<std::string> throttle_reason_names(uint64_t reasons) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {0x1, "gpu_idle"},          {0x2, "applications_clocks"},   {0x4, "sw_power_cap"},
      {0x8, "hw_slowdown"},       {0x10, "sync_boost"},           {0x20, "sw_thermal_slowdown"},
      {0x40, "hw_thermal_slowdown"}, {0x80, "hw_power_brake_slowdown"}, {0x100, "display_clock"}};
  std::vector<std::string> out;
  for (const auto& [bit, name] : kNames)
    if (reasons & bit) out.emplace_back(name);
  if (uint64_t rest = reasons & ~uint64_t(0x1ff)) out.push_back("0x" + [&] {
      char b[32];
      snprintf(b, sizeof(b), "%llx", static_cast<unsigned long long>(rest));
      return std::string(b);
    }());
  return out;
}

NvmlSampler::NvmlSampler() {
  void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    error_ = "libnvidia-ml.so.1 could not be loaded (no NVIDIA driver here?)";
    return;
  }
  auto lib = std::make_unique<NvmlLibrary>(h);
  // Versioned entry points first: the unversioned names are the oldest ABI.
  const bool required = (lib->bind(lib->Init, "nvmlInit_v2") || lib->bind(lib->Init, "nvmlInit")) &&
                        lib->bind(lib->Shutdown, "nvmlShutdown") &&
                        (lib->bind(lib->DeviceGetCount, "nvmlDeviceGetCount_v2") ||
                         lib->bind(lib->DeviceGetCount, "nvmlDeviceGetCount")) &&
                        (lib->bind(lib->DeviceGetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2") ||
                         lib->bind(lib->DeviceGetHandleByIndex, "nvmlDeviceGetHandleByIndex"));
  if (!required) {
    lib->Shutdown = nullptr;
    error_ = "libnvidia-ml.so.1 lacks nvmlInit/nvmlDeviceGetCount: too old a driver";
    return;
  }
  lib->bind(lib->ErrorString, "nvmlErrorString");
  lib->bind(lib->SystemGetDriverVersion, "nvmlSystemGetDriverVersion");
  lib->bind(lib->DeviceGetName, "nvmlDeviceGetName");
  lib->bind(lib->DeviceGetUUID, "nvmlDeviceGetUUID");
  lib->bind(lib->DeviceGetUtilizationRates, "nvmlDeviceGetUtilizationRates");
  lib->bind(lib->DeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo");
  lib->bind(lib->DeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2");
  lib->bind(lib->DeviceGetPowerUsage, "nvmlDeviceGetPowerUsage");
  lib->bind(lib->DeviceGetEnforcedPowerLimit, "nvmlDeviceGetEnforcedPowerLimit");
  lib->bind(lib->DeviceGetTemperature, "nvmlDeviceGetTemperature");
  lib->bind(lib->DeviceGetClockInfo, "nvmlDeviceGetClockInfo");
  if (!lib->bind(lib->DeviceGetCurrentClocksThrottleReasons, "nvmlDeviceGetCurrentClocksEventReasons"))
    lib->bind(lib->DeviceGetCurrentClocksThrottleReasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  lib->bind(lib->DeviceGetPcieThroughput, "nvmlDeviceGetPcieThroughput");
  lib->bind(lib->DeviceGetTotalEccErrors, "nvmlDeviceGetTotalEccErrors");
  lib->bind(lib->DeviceGetProcessUtilization, "nvmlDeviceGetProcessUtilization");
  if (!lib->bind(lib->DeviceGetComputeRunningProcesses, "nvmlDeviceGetComputeRunningProcesses_v3") &&
      !lib->bind(lib->DeviceGetComputeRunningProcesses, "nvmlDeviceGetComputeRunningProcesses_v2"))
    lib->DeviceGetComputeRunningProcesses = nullptr;  // v1's structure is smaller: not used
  lib->bind(lib->EventSetCreate, "nvmlEventSetCreate");
  lib->bind(lib->EventSetFree, "nvmlEventSetFree");
  lib->bind(lib->DeviceRegisterEvents, "nvmlDeviceRegisterEvents");
  if (!lib->bind(lib->EventSetWait, "nvmlEventSetWait_v2")) lib->EventSetWait = nullptr;
  if (!(lib->bind(lib->GpmQueryDeviceSupport, "nvmlGpmQueryDeviceSupport") &&
        lib->bind(lib->GpmSampleAlloc, "nvmlGpmSampleAlloc") && lib->bind(lib->GpmSampleFree, "nvmlGpmSampleFree") &&
        lib->bind(lib->GpmSampleGet, "nvmlGpmSampleGet") && lib->bind(lib->GpmMetricsGet, "nvmlGpmMetricsGet")))
    lib->GpmQueryDeviceSupport = nullptr;  // a driver before GPM (R520)

  if (nvmlReturn_t r = lib->Init(); r != NVML_SUCCESS) {
    error_ = "NVML could not start: " + lib->error_text(r);
    lib->Shutdown = nullptr;
    return;
  }
  unsigned int count = 0;
  if (nvmlReturn_t r = lib->DeviceGetCount(&count); r != NVML_SUCCESS || count == 0) {
    error_ = r != NVML_SUCCESS ? "NVML lists no GPU: " + lib->error_text(r) : "NVML lists no GPU";
    return;
  }
  if (lib->EventSetCreate && lib->EventSetCreate(&lib->event_set_) != NVML_SUCCESS) lib->event_set_ = nullptr;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t d = nullptr;
    if (lib->DeviceGetHandleByIndex(i, &d) != NVML_SUCCESS) continue;
    GpuDevice dev;
    dev.index = i;
    char buf[128] = {};
    if (lib->DeviceGetName && lib->DeviceGetName(d, buf, sizeof(buf)) == NVML_SUCCESS) dev.name = buf;
    std::memset(buf, 0, sizeof(buf));
    if (lib->DeviceGetUUID && lib->DeviceGetUUID(d, buf, sizeof(buf)) == NVML_SUCCESS) dev.uuid = buf;
    nvmlMemory_t mem{};
    if (lib->DeviceGetMemoryInfo && lib->DeviceGetMemoryInfo(d, &mem) == NVML_SUCCESS) dev.memory_total = mem.total;
    unsigned int limit = 0;
    if (lib->DeviceGetEnforcedPowerLimit && lib->DeviceGetEnforcedPowerLimit(d, &limit) == NVML_SUCCESS)
      dev.power_limit_mw = limit;
    // XIDs (the driver's error reports) arrive as events; where registering is refused (no
    // permission, a GPU without them) they are simply not watched.
    if (lib->event_set_ && lib->DeviceRegisterEvents)
      lib->DeviceRegisterEvents(d, nvmlEventTypeXidCriticalError, lib->event_set_);
    NvmlLibrary::Gpm gpm;
    nvmlGpmSupport_t support{kGpmSupportVersion, 0};
    if (lib->GpmQueryDeviceSupport && lib->GpmQueryDeviceSupport(d, &support) == NVML_SUCCESS &&
        support.isSupportedDevice && lib->GpmSampleAlloc(&gpm.samples[0]) == NVML_SUCCESS &&
        lib->GpmSampleAlloc(&gpm.samples[1]) != NVML_SUCCESS)
      gpm.samples[1] = nullptr;
    lib->gpm.push_back(gpm);
    lib->handles.push_back(d);
    devices_.push_back(std::move(dev));
  }
  last_process_ts_.assign(devices_.size(), 0);
  unsupported_.assign(devices_.size(), 0);
  lib_ = std::move(lib);
}

NvmlSampler::~NvmlSampler() { stop(); }

std::string NvmlSampler::driver_version() const {
  char buf[96] = {};
  if (lib_ && lib_->SystemGetDriverVersion && lib_->SystemGetDriverVersion(buf, sizeof(buf)) == NVML_SUCCESS)
    return buf;
  return {};
}

NvmlSampler::Batch NvmlSampler::sample_once(bool slow) {
  Batch b;
  if (!lib_) return b;
  NvmlLibrary& L = *lib_;
  for (size_t i = 0; i < devices_.size(); ++i) {
    nvmlDevice_t d = L.handles[i];
    uint32_t& off = unsupported_[i];
    // Calls a getter unless NVML said before that it is not supported on this GPU.
    auto ask = [&](uint32_t metric, auto&& call) {
      if (off & metric) return false;
      const uint64_t t0 = monotonic_ns();
      const nvmlReturn_t r = call();
      note_cost(metric, monotonic_ns() - t0);
      if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_NOT_FOUND) off |= metric;
      return r == NVML_SUCCESS;
    };
    GpuSample s;
    s.ts_ns = monotonic_ns();
    s.device = devices_[i].index;
    nvmlUtilization_t u{};
    if (L.DeviceGetUtilizationRates && ask(kUtil, [&] { return L.DeviceGetUtilizationRates(d, &u); })) {
      s.gpu_util = u.gpu;
      s.mem_util = u.memory;
    }
    nvmlMemory_v2_t m2{};
    m2.version = kMemoryV2;
    nvmlMemory_t m{};
    if (L.DeviceGetMemoryInfo_v2 && !(off & kMemoryV2Bit)) {
      const uint64_t t0 = monotonic_ns();
      const nvmlReturn_t r = L.DeviceGetMemoryInfo_v2(d, &m2);
      note_cost(kMemory, monotonic_ns() - t0);
      if (r == NVML_SUCCESS)
        s.mem_used = m2.used;
      else
        off |= kMemoryV2Bit;  // an older driver: v1, whose `used` includes the driver's reservation
    }
    if (!s.mem_used && L.DeviceGetMemoryInfo && ask(kMemory, [&] { return L.DeviceGetMemoryInfo(d, &m); }))
      s.mem_used = m.used;
    unsigned int v = 0;
    if (L.DeviceGetPowerUsage && ask(kPower, [&] { return L.DeviceGetPowerUsage(d, &v); })) s.power_mw = v;
    if (L.DeviceGetTemperature && ask(kTemp, [&] { return L.DeviceGetTemperature(d, NVML_TEMPERATURE_GPU, &v); }))
      s.temperature_c = v;
    if (L.DeviceGetClockInfo && ask(kSmClock, [&] { return L.DeviceGetClockInfo(d, NVML_CLOCK_SM, &v); }))
      s.sm_clock_mhz = v;
    if (L.DeviceGetClockInfo && ask(kMemClock, [&] { return L.DeviceGetClockInfo(d, NVML_CLOCK_MEM, &v); }))
      s.mem_clock_mhz = v;
    unsigned long long ull = 0;
    if (L.DeviceGetCurrentClocksThrottleReasons &&
        ask(kThrottle, [&] { return L.DeviceGetCurrentClocksThrottleReasons(d, &ull); }))
      s.throttle_reasons = ull;
    // NVML measures PCIe throughput for ~20 ms per call: read on slow ticks only.
    if (slow && L.DeviceGetPcieThroughput &&
        ask(kPcieTx, [&] { return L.DeviceGetPcieThroughput(d, NVML_PCIE_UTIL_TX_BYTES, &v); }))
      s.pcie_tx_kbs = v;
    if (slow && L.DeviceGetPcieThroughput &&
        ask(kPcieRx, [&] { return L.DeviceGetPcieThroughput(d, NVML_PCIE_UTIL_RX_BYTES, &v); }))
      s.pcie_rx_kbs = v;
    if (L.DeviceGetTotalEccErrors &&
        ask(kEccCorrected, [&] {
          return L.DeviceGetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &ull);
        }))
      s.ecc_corrected = ull;
    if (L.DeviceGetTotalEccErrors &&
        ask(kEccUncorrected, [&] {
          return L.DeviceGetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ull);
        }))
      s.ecc_uncorrected = ull;
    // GPM: a sample costs ~0.3 ms of this thread, with its metrics 1-3 ms (bench/gpu/gpm_probe.py):
    // slow ticks only, the metrics covering the time since the last.
    if (auto& g = L.gpm[i]; slow && g.samples[0] && g.samples[1] && !(off & kGpm)) {
      const uint64_t t0 = monotonic_ns();
      const nvmlReturn_t r = L.GpmSampleGet(d, g.samples[g.next]);
      if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_NO_PERMISSION) off |= kGpm;
      if (r == NVML_SUCCESS && g.primed) {
        nvmlGpmMetricsGet_t get{};
        get.version = kGpmMetricsGetVersion;
        get.sample1 = g.samples[g.next ^ 1];
        get.sample2 = g.samples[g.next];
        const unsigned int ids[] = {NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY,
                                    NVML_GPM_METRIC_ANY_TENSOR_UTIL, NVML_GPM_METRIC_DRAM_BW_UTIL};
        std::optional<double>* into[] = {&s.sm_active, &s.sm_occupancy, &s.tensor_active, &s.dram_active};
        get.numMetrics = std::size(ids);
        for (size_t k = 0; k < std::size(ids); ++k) get.metrics[k].metricId = ids[k];
        if (L.GpmMetricsGet(&get) == NVML_SUCCESS)
          for (size_t k = 0; k < std::size(ids); ++k)
            if (get.metrics[k].nvmlReturn == NVML_SUCCESS && get.metrics[k].value >= 0)
              *into[k] = std::min(get.metrics[k].value, 100.0);
      }
      // A sample refused (another profiler holds the counters) breaks the pair: start again.
      g.primed = r == NVML_SUCCESS;
      if (g.primed) g.next ^= 1;
      note_cost(kGpm, monotonic_ns() - t0);
    }
    b.samples.push_back(s);

    // Per process: NVML's utilization samples since the last ones read, and memory in use.
    std::vector<GpuProcessSample> procs;
    auto proc = [&](uint32_t pid) -> GpuProcessSample& {
      for (auto& p : procs)
        if (p.pid == pid) return p;
      procs.push_back(GpuProcessSample{s.ts_ns, s.device, pid, {}, {}, {}});
      return procs.back();
    };
    // Per-process queries walk the driver's process lists: slow ticks only, like PCIe.
    if (slow && L.DeviceGetProcessUtilization && !(off & kProcUtil)) {
      const uint64_t t0 = monotonic_ns();
      // Asked for the count first, then read into a buffer that holds them all (a short buffer
      // is refused and left unwritten).
      unsigned int n = 0;
      nvmlReturn_t r = L.DeviceGetProcessUtilization(d, nullptr, &n, last_process_ts_[i]);
      std::vector<nvmlProcessUtilizationSample_t> samples;
      if (r == NVML_ERROR_INSUFFICIENT_SIZE && n > 0 && n < 4096) {
        samples.resize(n);
        r = L.DeviceGetProcessUtilization(d, samples.data(), &n, last_process_ts_[i]);
        samples.resize(std::min<size_t>(n, samples.size()));
      }
      if (r == NVML_ERROR_NOT_SUPPORTED) off |= kProcUtil;
      if (r == NVML_SUCCESS) {
        // Several samples of one process average into one reading.
        struct Sum {
          uint64_t sm = 0, mem = 0, n = 0;
        };
        std::vector<std::pair<uint32_t, Sum>> sums;
        for (size_t k = 0; k < samples.size(); ++k) {
          last_process_ts_[i] = std::max<uint64_t>(last_process_ts_[i], samples[k].timeStamp);
          auto it = std::find_if(sums.begin(), sums.end(), [&](auto& e) { return e.first == samples[k].pid; });
          if (it == sums.end()) it = sums.insert(sums.end(), {samples[k].pid, Sum{}});
          it->second.sm += samples[k].smUtil;
          it->second.mem += samples[k].memUtil;
          ++it->second.n;
        }
        for (const auto& [pid, sum] : sums) {
          auto& p = proc(pid);
          p.sm_util = uint32_t(sum.sm / sum.n);
          p.mem_util = uint32_t(sum.mem / sum.n);
        }
      }
      note_cost(kProcUtil, monotonic_ns() - t0);
    }
    if (slow && L.DeviceGetComputeRunningProcesses && !(off & kProcMemory)) {
      const uint64_t t0 = monotonic_ns();
      nvmlProcessInfo_t infos[256] = {};
      unsigned int n = 256;
      const nvmlReturn_t r = L.DeviceGetComputeRunningProcesses(d, &n, infos);
      if (r == NVML_ERROR_NOT_SUPPORTED) off |= kProcMemory;
      if (r == NVML_SUCCESS)
        for (unsigned int k = 0; k < std::min(n, 256u); ++k)
          if (infos[k].usedGpuMemory != kNotAvailable) proc(infos[k].pid).used_memory = infos[k].usedGpuMemory;
      note_cost(kProcMemory, monotonic_ns() - t0);
    }
    b.processes.insert(b.processes.end(), procs.begin(), procs.end());
  }
  // XID events that arrived since the last tick.
  if (L.event_set_ && L.EventSetWait) {
    for (int k = 0; k < 16; ++k) {
      nvmlEventData_t e{};
      const nvmlReturn_t r = L.EventSetWait(L.event_set_, &e, 0);
      if (r != NVML_SUCCESS) break;
      uint32_t dev = 0;
      for (size_t i = 0; i < L.handles.size(); ++i)
        if (L.handles[i] == e.device) dev = devices_[i].index;
      b.events.push_back(GpuEvent{monotonic_ns(), dev, "xid", e.eventData});
    }
  }
  return b;
}

void NvmlSampler::note_cost(uint32_t metric, uint64_t ns) {
  for (size_t i = 0; i < costs_.size(); ++i)
    if (metric == (1u << i)) {
      costs_[i].first += 1;
      costs_[i].second += ns;
    }
}

std::vector<std::pair<std::string, double>> NvmlSampler::call_costs() const {
  static const char* kNames[] = {"utilization", "memory", "power", "temperature", "sm clock", "mem clock",
                                 "throttle reasons", "pcie tx", "pcie rx", "ecc corrected", "ecc uncorrected",
                                 "process utilization", "process memory", "memory v2", "gpm"};
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < costs_.size() && i < std::size(kNames); ++i)
    if (costs_[i].first) out.emplace_back(kNames[i], costs_[i].second / 1e3 / double(costs_[i].first));
  return out;
}

void NvmlSampler::start(double hz, Sink sink, double slow_hz) {
  if (!lib_ || hz <= 0 || thread_.joinable()) return;
  stop_.reset();
  thread_ = std::thread([this, hz, slow_hz, sink = std::move(sink)] {
    name_this_thread("gs-nvml");
    const auto period = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / hz));
    const uint64_t slow_every = std::max<uint64_t>(1, uint64_t(hz / std::max(slow_hz, 1e-6) + 0.5));
    auto next = std::chrono::steady_clock::now();
    for (uint64_t tick = 0;; ++tick) {
      sink(sample_once(tick % slow_every == 0));
      next += period;
      const auto now = std::chrono::steady_clock::now();
      if (next < now) next = now;  // a slow tick (PCIe counters take ~20 ms): no catching up
      if (!stop_.sleep_until(next)) break;
    }
  });
}

void NvmlSampler::stop() {
  stop_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpuscope::gpu
