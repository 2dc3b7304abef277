// What the agent's live diagnosis costs its main thread: LiveDiagnosis fed one second at a time
// as the aggregator feeds it, a loop of the H100 training step's shape (--step-us, --launches a
// step, a copy in, its main thread's and --threads other threads' 10 ms windows, NVML at 10 Hz,
// pressure twice a second), then tick() timed. Prints the tick's time and its share of a core
// at one tick a second, and the time the calls took to add.
//
//     build/bench/live_diagnosis_cost [--step-us 4000] [--launches 119] [--threads 8] [--seconds 20]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <algorithm>

#include "agent/live_diagnosis.h"
#include "cuda/functions.h"

using namespace gpuscope;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  double step_us = 4000, seconds = 20;
  int launches = 119, threads = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (k == "--step-us") step_us = v;
    else if (k == "--launches") launches = int(v);
    else if (k == "--threads") threads = int(v);
    else if (k == "--seconds") seconds = v;
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  agent::LiveDiagnosis live(agent::LiveDiagnosis::Limits{});
  live.set_probe_costs(700, 1300);
  const uint32_t pid = 4242;
  const auto* launch = cuda::function_by_symbol("cudaLaunchKernel");
  const auto* copy = cuda::function_by_symbol("cudaMemcpyAsync");
  const uint64_t step_ns = uint64_t(step_us * 1e3), t0 = 1'000'000'000;
  uint64_t next_step = t0, next_window = t0, next_gpu = t0, next_pressure = t0;
  std::vector<double> tick_ms, add_ms;
  for (int s = 1; s <= int(seconds); ++s) {
    const uint64_t until = t0 + uint64_t(s) * 1'000'000'000;
    const auto a0 = Clock::now();
    for (; next_step < until; next_step += step_ns) {
      CallEvent e;
      e.pid = e.tid = pid;
      e.comm = "python3";
      e.has_return = true;
      e.func = copy->id;
      e.ts_ns = next_step;
      e.duration_ns = 9'000;
      e.bytes = 1 << 20;
      e.dir = cuda::CopyDir::HostToDevice;
      live.add_call(e);
      for (int l = 0; l < launches; ++l) {
        e.func = launch->id;
        e.ts_ns = next_step + 20'000 + uint64_t(l) * (step_ns - 40'000) / uint64_t(launches);
        e.duration_ns = 3'000;
        e.bytes = 0;
        e.kernel_handle = 0x1000 + uint64_t(l % 40) * 0x40;
        live.add_call(e);
      }
    }
    for (; next_window < until; next_window += 10'000'000)
      for (int t = 0; t <= threads; ++t) {
        store::ThreadTimeRow r;
        r.pid = pid;
        r.tid = pid + uint32_t(t);
        r.start_ns = next_window;
        r.end_ns = next_window + 10'000'000;
        r.on_cpu_ns = t ? 1'000'000 : 9'600'000;
        r.sleep_ns = t ? 9'000'000 : 0;
        r.sys_ns = t ? 100'000 : 600'000;
        r.state = t ? "sleep" : "on_cpu";
        live.add_thread_time(r);
      }
    for (; next_gpu < until; next_gpu += 100'000'000) {
      gpu::NvmlSampler::Batch b;
      gpu::GpuSample g;
      g.ts_ns = next_gpu;
      g.gpu_util = 91;
      g.sm_clock_mhz = 1980;
      b.samples.push_back(g);
      live.add_gpu_batch(b);
    }
    for (; next_pressure < until; next_pressure += 500'000'000) {
      host::PressureReading h;
      h.ts_ns = next_pressure;
      live.add_pressure(h);
      h.pid = pid;
      live.add_pressure(h);
    }
    const auto a1 = Clock::now();
    live.tick(until);
    const auto a2 = Clock::now();
    add_ms.push_back(std::chrono::duration<double, std::milli>(a1 - a0).count());
    if (s > 3) tick_ms.push_back(std::chrono::duration<double, std::milli>(a2 - a1).count());
  }
  std::sort(tick_ms.begin(), tick_ms.end());
  std::sort(add_ms.begin(), add_ms.end());
  const auto cur = live.current();
  const double calls_per_s = 1e9 / double(step_ns) * (launches + 1);
  std::printf("step %.0f us, %d launches a step (%.0f calls/s), %d other threads\n", step_us, launches,
              calls_per_s, threads);
  std::printf("tick: median %.2f ms, max %.2f ms over %zu ticks = %.2f%% of a core at 1 tick/s\n",
              tick_ms[tick_ms.size() / 2], tick_ms.back(), tick_ms.size(), tick_ms[tick_ms.size() / 2] / 10);
  std::printf("adding a second's evidence: median %.2f ms (%.0f ns a call)\n", add_ms[add_ms.size() / 2],
              add_ms[add_ms.size() / 2] * 1e6 / calls_per_s);
  std::printf("analysed: %zu process(es), step %.2f ms, %zu findings\n", cur.size(),
              cur.empty() ? 0.0 : cur[0].step_s * 1e3, cur.empty() ? size_t(0) : cur[0].findings.size());
  return 0;
}
