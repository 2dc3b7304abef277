// How often NVML refreshes each value, and what reading it costs: polls every GPU through
// gpuscope's own NVML sampler at a high rate and reports, per metric, the median time between
// changes of its value. Sets `record`'s default --gpu-sample-hz (docs/performance.md).
//
//   nvml_refresh [seconds=6] [poll_hz=200]     (run it while the GPU works: values of an idle GPU rarely move)
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpu/nvml.h"

#include "common/clock.h"

using gpuscope::gpu::GpuSample;

using gpuscope::monotonic_ns;

namespace {


double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 6;
  const double poll_hz = argc > 2 ? std::atof(argv[2]) : 200;
  gpuscope::gpu::NvmlSampler nvml;
  if (!nvml.available()) {
    std::fprintf(stderr, "nvml_refresh: %s\n", nvml.error().c_str());
    return 1;
  }
  std::printf("driver %s, %zu GPU(s); polling at %.0f Hz for %.1f s\n", nvml.driver_version().c_str(),
              nvml.devices().size(), poll_hz, seconds);
  using Getter = std::function<std::optional<double>(const GpuSample&)>;
  const std::vector<std::pair<const char*, Getter>> metrics = {
      {"gpu_util", [](const GpuSample& s) { return s.gpu_util ? std::optional<double>(*s.gpu_util) : std::nullopt; }},
      {"mem_util", [](const GpuSample& s) { return s.mem_util ? std::optional<double>(*s.mem_util) : std::nullopt; }},
      {"mem_used", [](const GpuSample& s) { return s.mem_used ? std::optional<double>(*s.mem_used) : std::nullopt; }},
      {"power_mw", [](const GpuSample& s) { return s.power_mw ? std::optional<double>(*s.power_mw) : std::nullopt; }},
      {"temperature", [](const GpuSample& s) { return s.temperature_c ? std::optional<double>(*s.temperature_c) : std::nullopt; }},
      {"sm_clock", [](const GpuSample& s) { return s.sm_clock_mhz ? std::optional<double>(*s.sm_clock_mhz) : std::nullopt; }},
      {"throttle", [](const GpuSample& s) { return s.throttle_reasons ? std::optional<double>(*s.throttle_reasons) : std::nullopt; }},
      {"pcie_tx", [](const GpuSample& s) { return s.pcie_tx_kbs ? std::optional<double>(*s.pcie_tx_kbs) : std::nullopt; }},
      {"pcie_rx", [](const GpuSample& s) { return s.pcie_rx_kbs ? std::optional<double>(*s.pcie_rx_kbs) : std::nullopt; }},
  };
  std::map<std::pair<uint32_t, std::string>, std::vector<std::pair<uint64_t, double>>> seen;
  std::vector<double> tick_us[2], tick_cpu_us[2];  // [0]: without PCIe counters, [1]: with
  auto thread_cpu_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
  };
  uint64_t tick = 0;
  const uint64_t end = monotonic_ns() + uint64_t(seconds * 1e9);
  const auto period = std::chrono::nanoseconds(int64_t(1e9 / poll_hz));
  auto next = std::chrono::steady_clock::now();
  while (monotonic_ns() < end) {
    const bool pcie = ++tick % 2 == 0;
    const uint64_t t0 = monotonic_ns(), c0 = thread_cpu_ns();
    auto batch = nvml.sample_once(pcie);
    tick_us[pcie].push_back((monotonic_ns() - t0) / 1e3);
    tick_cpu_us[pcie].push_back((thread_cpu_ns() - c0) / 1e3);
    for (const auto& s : batch.samples)
      for (const auto& [name, get] : metrics)
        if (auto v = get(s)) {
          auto& series = seen[{s.device, name}];
          if (series.empty() || series.back().second != *v) series.push_back({s.ts_ns, *v});
        }
    next += period;
    std::this_thread::sleep_until(next);
  }
  for (int pcie = 0; pcie < 2; ++pcie)
    std::printf("one tick (every GPU, %s): median %.0f us wall, %.0f us CPU\n",
                pcie ? "slow: with PCIe throughput and per-process use" : "fast: device metrics only",
                median(tick_us[pcie]), median(tick_cpu_us[pcie]));
  std::printf("mean time per NVML query:\n");
  for (const auto& [name, us] : nvml.call_costs()) std::printf("  %-20s %9.1f us\n", name.c_str(), us);
  std::printf("%-4s %-12s %8s %22s\n", "GPU", "metric", "changes", "median ms between");
  for (const auto& [key, series] : seen) {
    std::vector<double> gaps;
    for (size_t i = 1; i < series.size(); ++i) gaps.push_back((series[i].first - series[i - 1].first) / 1e6);
    std::printf("%-4u %-12s %8zu %22.1f\n", key.first, key.second.c_str(), series.size() - 1, median(gaps));
  }
  return 0;
}
