// The GPU's own view through NVML: libnvidia-ml.so.1 is loaded at run time (no build dependency
// on a driver), and a sampler thread reads each GPU's metrics, the per-process use of the GPUs,
// and XID error events. Without NVML (no driver, no GPU) it says why once and samples nothing.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/stop_signal.h"

namespace gpuscope::gpu {

struct GpuDevice {
  uint32_t index = 0;
  std::string uuid, name;
  uint64_t memory_total = 0;     // bytes
  uint32_t power_limit_mw = 0;   // enforced power limit; 0: unknown
};

// One reading of one GPU; a field NVML does not offer on that GPU stays nullopt.
struct GpuSample {
  uint64_t ts_ns = 0;  // CLOCK_MONOTONIC
  uint32_t device = 0;
  std::optional<uint32_t> gpu_util, mem_util;  // percent of the last sample period
  std::optional<uint64_t> mem_used;            // bytes
  std::optional<uint32_t> power_mw, temperature_c, sm_clock_mhz, mem_clock_mhz;
  std::optional<uint64_t> throttle_reasons;  // nvmlClocksThrottleReason bits
  std::optional<uint32_t> pcie_tx_kbs, pcie_rx_kbs;
  std::optional<uint64_t> ecc_corrected, ecc_uncorrected;  // volatile counts since the driver loaded
  // GPM (Hopper and later), read on slow ticks, percent over the time since the last: SMs with work, warps
  // resident of the most the SMs hold, tensor cores at work, DRAM bandwidth of its peak. Unlike
  // gpu_util (a kernel ran at all), these say how much of the GPU the kernels used.
  std::optional<double> sm_active, sm_occupancy, tensor_active, dram_active;
};

// A process's use of one GPU, as NVML accounts it.
struct GpuProcessSample {
  uint64_t ts_ns = 0;
  uint32_t device = 0;
  uint32_t pid = 0;
  std::optional<uint32_t> sm_util, mem_util;  // percent, averaged by NVML since the last reading
  std::optional<uint64_t> used_memory;        // bytes
};

struct GpuEvent {
  uint64_t ts_ns = 0;
  uint32_t device = 0;
  std::string kind;  // "xid"
  uint64_t value = 0;
};

// Names of the throttle-reason bits set in `reasons` ("sw_power_cap", "hw_thermal_slowdown"...).
std::vector<std::string> throttle_reason_names(uint64_t reasons);

class NvmlLibrary;

class NvmlSampler {
 public:
  struct Batch {
    std::vector<GpuSample> samples;
    std::vector<GpuProcessSample> processes;
    std::vector<GpuEvent> events;
  };
  using Sink = std::function<void(Batch&&)>;

  // Loads NVML and lists the GPUs. On failure `error()` says why and start() does nothing.
  NvmlSampler();
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  bool available() const { return lib_ != nullptr; }
  const std::string& error() const { return error_; }
  const std::vector<GpuDevice>& devices() const { return devices_; }
  std::string driver_version() const;

  // Samples every GPU `hz` times per second on a thread of its own, handing each tick's readings
  // to `sink` (called on that thread); a tick in every hz / slow_hz is a slow one.
  void start(double hz, Sink sink, double slow_hz = kSlowHz);
  void stop();
  // One tick's readings now (what the thread does each period); a slow tick also reads PCIe
  // throughput and each process's use.
  Batch sample_once(bool slow = true);
  // Mean wall time of each NVML query so far, microseconds (what a tick spends where).
  std::vector<std::pair<std::string, double>> call_costs() const;
  // Slow ticks, by default at most this often: NVML takes ~20 ms per direction to measure PCIe
  // throughput, and the per-process queries are the costliest of the rest (bench/nvml_refresh).
  static constexpr double kSlowHz = 1;

 private:
  std::unique_ptr<NvmlLibrary> lib_;
  std::string error_;
  std::vector<GpuDevice> devices_;
  std::vector<uint64_t> last_process_ts_;  // per device: NVML's timestamp of the last process sample read
  std::vector<uint32_t> unsupported_;      // per device: bits of metrics NVML said it does not offer
  void note_cost(uint32_t metric, uint64_t ns);
  std::array<std::pair<uint64_t, uint64_t>, 15> costs_{};  // per metric bit: (calls, ns)
  std::thread thread_;
  StopSignal stop_;
};

}  // namespace gpuscope::gpu
