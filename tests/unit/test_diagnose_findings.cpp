// diagnose's rules on crafted records: who ended a wait decides what it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include "cuda/functions.h"
#include "diagnose/analysis.h"
#include "diagnose/kernel_activity.h"
#include "store/record_reader.h"
#include "store/record_writer.h"

using namespace gpuscope;

namespace {

constexpr uint32_t kPid = 100, kAutograd = 101, kHelper = 102;
constexpr uint64_t kStepNs = 10'000'000;

// A run of 40 steps of 10 ms, built piece by piece: the main thread's calls and windows, NVML's
// readings of the GPU, other processes on it.
struct CraftedRun {
  std::string path;
  store::RecordWriter w;
  int64_t next_id = 1;
  explicit CraftedRun(const std::string& name)
      : path((std::filesystem::temp_directory_path() / fmt::format("gpuscope_diag_{}_{}", name, getpid())).string()),
        w(path) {
    w.set_meta("start_ns", "0");
    w.set_meta("host_telemetry", "1");
    w.upsert_process(kPid, 1, "python3", "python3 train.py", "/usr/bin/python3", 0);
  }
  void call(std::string_view fn, uint32_t tid, uint64_t ts, uint64_t duration, uint64_t handle = 0,
            uint64_t bytes = 0) {
    CallEvent e;
    e.call_id = next_id++;
    e.func = cuda::function_by_symbol(fn)->id;
    e.pid = kPid;
    e.tid = tid;
    e.ts_ns = ts;
    e.duration_ns = duration;
    e.has_return = true;
    e.kernel_handle = handle;
    e.bytes = bytes;
    w.add_call(e);
  }
  // `launches` kernels a step from the main thread, 20 µs apart, after a copy in; then a sync of
  // `sync_ns` when there is one.
  void steps(int launches, uint64_t sync_ns = 0, uint64_t copy_bytes = 4 << 20) {
    for (uint64_t s = 0; s < 40; ++s) {
      const uint64_t t = 1'000'000 + s * kStepNs;
      call("cudaMemcpyAsync", kPid, t, 10'000, 0, copy_bytes);
      for (int k = 0; k < launches; ++k) call("cudaLaunchKernel", kPid, t + 50'000 + k * 20'000, 5'000, 0x1000 + k);
      if (sync_ns) call("cudaStreamSynchronize", kPid, t + kStepNs - sync_ns - 100'000, sync_ns);
    }
  }
  // `per_step` CPU samples of the main thread a step, each found in the kernel at `frames`
  // (innermost first), symbolised as the recorder names kernel frames.
  void kernel_samples(int per_step, const std::vector<std::string>& frames) {
    const int64_t module = w.intern_module("[kernel]", "test");
    std::vector<store::StoredFrame> stack;
    for (const auto& f : frames) {
      const uint64_t ip = 0xffffffff81000000ull + (next_ip += 0x100);
      w.add_symbol(module, ip, f);
      stack.push_back({module, ip, ip});
    }
    const int64_t id = w.intern_stack(stack);
    for (uint64_t s = 0; s < 40; ++s)
      for (int k = 0; k < per_step; ++k)
        w.add_sample(1'000'000 + s * kStepNs + uint64_t(k + 1) * kStepNs / uint64_t(per_step + 1), kPid, kPid, 0, 0,
                     id);
  }
  uint64_t next_ip = 0;
  // A window a step of the main thread: on a CPU for the rest of the step.
  void windows(uint64_t lock_ns = 0, uint32_t waker_tid = 0, uint32_t waker_pid = kPid) {
    for (uint64_t s = 0; s < 40; ++s) {
      const uint64_t t = 1'000'000 + s * kStepNs;
      store::ThreadTimeRow r;
      r.pid = kPid;
      r.tid = kPid;
      r.start_ns = t;
      r.end_ns = t + kStepNs;
      r.on_cpu_ns = kStepNs - lock_ns;
      r.lock_ns = lock_ns;
      r.blocked_ns = lock_ns;
      r.waker_tid = waker_tid;
      r.waker_pid = waker_pid;
      r.state = "on_cpu";
      w.add_thread_time(r);
    }
  }
  // A window a step of the main thread, on a CPU unless `fill` says otherwise.
  void windows_where(const std::function<void(store::ThreadTimeRow&)>& fill) {
    for (uint64_t s = 0; s < 40; ++s) {
      store::ThreadTimeRow r;
      r.pid = r.tid = kPid;
      r.start_ns = 1'000'000 + s * kStepNs;
      r.end_ns = r.start_ns + kStepNs;
      r.on_cpu_ns = kStepNs;
      r.state = "on_cpu";
      fill(r);
      w.add_thread_time(r);
    }
  }
  // Readings of the job's cgroup (/job) every 100 ms over the steps; `fill` sets the k-th's counters.
  void cgroup_readings(const std::function<void(host::PressureReading&, uint64_t k)>& fill) {
    for (uint64_t k = 0; k <= 5; ++k) {
      host::PressureReading p;
      p.ts_ns = k * 100'000'000;
      p.pid = kPid;
      p.cgroup = "/job";
      fill(p, k);
      w.add_pressure(p);
    }
  }
  // NVML: one reading of the GPU at `ts`, busy `util` (0..100).
  void gpu_reading(uint64_t ts, uint32_t util) {
    gpu::NvmlSampler::Batch b;
    gpu::GpuSample g;
    g.ts_ns = ts;
    g.gpu_util = util;
    b.samples.push_back(g);
    w.add_gpu_batch(b);
  }
  // The run, finished, diagnosed with its slow steps ranked so, then removed.
  diagnose::Diagnosis diagnosed(diagnose::SlowSteps ranking) {
    w.finish();
    diagnose::Diagnosis d;
    {
      store::RecordReader reader(path);
      diagnose::DiagnoseOptions opts;
      opts.slow_ranking = ranking;
      d = diagnose::diagnose(reader, nullptr, opts);
    }
    std::filesystem::remove(path);
    return d;
  }
  // NVML: a reading of the GPU a step, busy `util` (0..100); per-process readings each 10th step.
  // `sm_active`: GPM's share of the SMs with work (percent), where the GPU has GPM.
  void gpu(uint32_t util, std::vector<std::pair<uint32_t, uint32_t>> sm = {}, uint32_t pcie_kbs = 0,
           uint32_t clock_mhz = 1980, uint64_t throttle = 0, std::optional<double> sm_active = {}) {
    for (uint64_t s = 0; s < 40; ++s) {
      gpu::NvmlSampler::Batch b;
      gpu::GpuSample g;
      g.ts_ns = 1'000'000 + s * kStepNs + 5'000'000;
      g.gpu_util = util;
      g.sm_active = sm_active;
      // The first readings at full clock, the rest as asked.
      g.sm_clock_mhz = s < 4 ? 1980 : clock_mhz;
      g.throttle_reasons = s < 4 ? 0 : throttle;
      if (s % 10 == 0) g.pcie_tx_kbs = g.pcie_rx_kbs = pcie_kbs / 2;
      b.samples.push_back(g);
      if (s % 10 == 0)
        for (const auto& [pid, util] : sm) b.processes.push_back({g.ts_ns, 0, pid, util, 0, 1 << 30});
      w.add_gpu_batch(b);
    }
  }
};

// The record at `path`, diagnosed, then removed.
diagnose::Diagnosis diagnosis_at(const std::string& path) {
  store::RecordReader reader(path);
  auto d = diagnose::diagnose(reader);
  std::filesystem::remove(path);
  return d;
}

std::vector<std::string> causes(const std::string& path) {
  std::vector<std::string> out;
  for (const auto& p : diagnosis_at(path).processes)
    for (const auto& f : p.findings) out.push_back(f.cause);
  return out;
}

diagnose::Diagnosis diagnosis_of(CraftedRun& r) {
  r.w.finish();
  return diagnosis_at(r.path);
}

std::vector<std::string> causes_of(CraftedRun& r) {
  r.w.finish();
  return causes(r.path);
}

// The first finding of the run's one process; none where there is not one process with findings.
std::optional<diagnose::Finding> top_finding_of(CraftedRun& r) {
  const auto d = diagnosis_of(r);
  if (d.processes.size() != 1 || d.processes[0].findings.empty()) return std::nullopt;
  return d.processes[0].findings[0];
}

// The main thread copies in and launches, the autograd thread launches; the main thread blocks
// 5 ms a step in futex, ended by `waker` (a thread of the process). `autograd_held_by`: the autograd
// thread's own time in those 5 ms, blocked in futex until that thread woke it (0: it ran).
std::vector<std::string> causes_with_waits(const std::string& name, uint32_t waker, uint32_t autograd_held_by = 0) {
  CraftedRun r(name);
  for (uint64_t s = 0; autograd_held_by && s < 40; ++s) {
    store::ThreadTimeRow a;
    a.pid = kPid;
    a.tid = kAutograd;
    a.start_ns = 1'000'000 + s * kStepNs + 1'000'000;
    a.end_ns = a.start_ns + 5'000'000;
    a.on_cpu_ns = 500'000;
    a.lock_ns = a.blocked_ns = 4'500'000;
    a.waker_tid = autograd_held_by;
    a.waker_pid = kPid;
    a.state = "on_cpu";
    r.w.add_thread_time(a);
  }
  for (uint64_t s = 0; s < 40; ++s) {
    const uint64_t t = 1'000'000 + s * kStepNs;
    r.call("cudaMemcpyAsync", kPid, t, 0);
    r.call("cudaLaunchKernel", kPid, t + 100'000, 0, 0xa0);
    r.call("cudaLaunchKernel", kAutograd, t + 6'000'000, 0, 0xb0);
  }
  r.windows(5'000'000, waker);
  return causes_of(r);
}

}  // namespace

TEST(DiagnoseFindings, WaitingForTheThreadThatCarriesOnTheGpuWorkIsNoFinding) {
  // PyTorch's main thread waits while its autograd engine launches the backward pass.
  EXPECT_EQ(causes_with_waits("handoff", kAutograd), std::vector<std::string>{"none"});
}

TEST(DiagnoseFindings, AHandoffToAThreadHeldByTheGilIsLockWait) {
  // The main thread waits for autograd's thread, which waits 90% of that time for a preprocessing
  // thread's GIL: the step is held up by that thread, not by the backward pass's work.
  EXPECT_EQ(causes_with_waits("handoff_held", kAutograd, kHelper), std::vector<std::string>{"lock_wait"});
  // Waiting in turn for the main thread (work handed back and forth) stays a handoff.
  EXPECT_EQ(causes_with_waits("handoff_turns", kAutograd, kPid), std::vector<std::string>{"none"});
}

TEST(DiagnoseFindings, ASocketWaitBesideAHandoffIsInputWait) {
  // The main thread waits 5 ms a step for autograd's thread (the backward pass) and 3 ms on the
  // socket its input comes through, in the same windows: the longer wait, autograd's, names each
  // window's waker; the socket's 3 ms are still a wait for input.
  CraftedRun r("handoff_and_socket");
  for (uint64_t s = 0; s < 40; ++s) {
    const uint64_t t = 1'000'000 + s * kStepNs;
    r.call("cudaMemcpyAsync", kPid, t, 0);
    r.call("cudaLaunchKernel", kPid, t + 100'000, 0, 0xa0);
    r.call("cudaLaunchKernel", kAutograd, t + 6'000'000, 0, 0xb0);
  }
  r.windows_where([](store::ThreadTimeRow& w) {
    w.lock_ns = 5'000'000;
    w.fd_ns = 3'000'000;
    w.blocked_ns = w.lock_ns + w.fd_ns;
    w.on_cpu_ns = kStepNs - w.blocked_ns;
    w.waker_tid = kAutograd;
    w.waker_pid = kPid;
  });
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"input_wait"});
}

TEST(DiagnoseFindings, WaitingForAThreadThatMakesNoCudaCallIsLockWait) {
  // A preprocessing thread holding the GIL.
  EXPECT_EQ(causes_with_waits("lock", kHelper), std::vector<std::string>{"lock_wait"});
}


TEST(DiagnoseFindings, AHostWaitWhileTheGpuStaysBusyCostsNothing) {
  // Half of each step blocked on a preprocessing thread, yet the GPU never ran out of work.
  CraftedRun r("busy_gpu");
  r.steps(20);
  r.windows(5'000'000, kHelper);
  r.gpu(99, {{kPid, 95}});
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"none"});
}

TEST(DiagnoseFindings, TheSameWaitWhileTheGpuIdlesIsAFinding) {
  CraftedRun r("idle_gpu");
  r.steps(20);
  r.windows(6'000'000, kHelper);
  r.gpu(40, {{kPid, 40}});
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"lock_wait"});
}

TEST(DiagnoseFindings, ASyncEveryStepThatLeavesTheGpuIdleIsNamed) {
  // 4 ms a step in cudaStreamSynchronize (spinning: on a CPU), and the GPU idle 40% of the time.
  CraftedRun r("sync");
  r.steps(20, 4'000'000);
  r.windows();
  r.gpu(60, {{kPid, 60}});
  const auto c = causes_of(r);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "sync_per_step");
}

TEST(DiagnoseFindings, ManyLaunchesAndAnIdleGpuAreLaunchBound) {
  // 400 launches a step, the thread on a CPU all the step, the GPU busy 30%.
  CraftedRun r("launch");
  r.steps(400);
  r.windows();
  r.gpu(30, {{kPid, 30}});
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"launch_bound"});
}

TEST(DiagnoseFindings, ABusyGpuWithMostOfItsSmsIdleRunsKernelsTooSmallForIt) {
  // NVML counts the GPU 95% busy, GPM says 20% of its SMs had work; 20 launches a step, the host
  // thread not limited by launching (500 µs of host time a launch) and waiting for the GPU 3 ms a
  // step (a host that never waited would be what sets the pace: AHostThatNeverWaits... below).
  CraftedRun r("small_kernels");
  r.steps(20, 3'000'000);
  r.windows();
  r.gpu(95, {{kPid, 95}}, 0, 1980, 0, 20.0);
  const auto top = top_finding_of(r);
  ASSERT_TRUE(top);
  const auto& f = *top;
  EXPECT_EQ(f.cause, "small_kernels");
  EXPECT_NEAR(f.share, 0.95 * (1 - 20.0 / 95), 0.02);
  EXPECT_NE(f.evidence.find("SMs had work 20%"), std::string::npos) << f.evidence;
}

TEST(DiagnoseFindings, SmallKernelsLaunchedAsFastAsTheHostCanAreLaunchBound) {
  // The same GPU, 400 launches a step from a thread on a CPU all the step: NVML alone calls the
  // GPU busy (no finding); its idle SMs say the launches hold it back.
  CraftedRun r("small_kernels_launch");
  r.steps(400);
  r.windows();
  r.gpu(95, {{kPid, 95}}, 0, 1980, 0, 20.0);
  const auto c = causes_of(r);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "launch_bound");
}

TEST(DiagnoseFindings, ABusyGpuWhoseSmsHaveWorkIsBoundByItsWork) {
  // The host waits for the GPU 3 ms a step (GPU-bound), its SMs active 85% of the time.
  CraftedRun r("full_kernels");
  r.steps(400, 3'000'000);
  r.windows();
  r.gpu(97, {{kPid, 97}}, 0, 1980, 0, 85.0);
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"none"});
}

TEST(DiagnoseFindings, AHostThatNeverWaitsForTheGpuPacesItWhateverNvmlSays) {
  // 400 quick launches a step from a thread on a CPU all the step, never in a sync: NVML calls the
  // GPU 98% busy, GPM sees its SMs active 73% of the time. The GPU idles up to 27%: launch-bound.
  CraftedRun r("host_paced");
  r.steps(400);
  r.windows();
  r.gpu(98, {{kPid, 98}}, 0, 1980, 0, 73.0);
  const auto top = top_finding_of(r);
  ASSERT_TRUE(top);
  const auto& f = *top;
  EXPECT_EQ(f.cause, "launch_bound");
  EXPECT_NEAR(f.share, 0.27, 0.02);
  EXPECT_NE(f.evidence.find("SMs active 73% by GPM"), std::string::npos) << f.evidence;
}

TEST(DiagnoseFindings, AHostThatWaitsForTheGpuKeepsNvmlsBusyShare) {
  // The same readings, the thread in a sync 2 ms a step: the GPU sets the pace, nothing to find.
  CraftedRun r("gpu_paced");
  r.steps(400, 2'000'000);
  r.windows();
  r.gpu(98, {{kPid, 98}}, 0, 1980, 0, 73.0);
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"none"});
}

TEST(DiagnoseFindings, FewLaunchesAndABusyHostThreadIsHostCompute) {
  CraftedRun r("host");
  r.steps(4);
  r.windows();
  r.gpu(30, {{kPid, 30}});
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"host_compute"});
}

TEST(DiagnoseFindings, AnotherProcessComputingOnTheGpuIsNamed) {
  CraftedRun r("tenant");
  r.w.upsert_process(4242, 1, "burner", "python3 burn.py", "/usr/bin/python3", 0);
  r.steps(20);
  r.windows();
  r.gpu(99, {{kPid, 45}, {4242, 50}});
  const auto c = causes_of(r);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "gpu_contention");
}

TEST(DiagnoseFindings, AnotherProcessCopyingOverPcieIsNamed) {
  // The GPU idles 40%, another process on it moves 20 GB/s over PCIe; this one copies 4 MB a step.
  CraftedRun r("pcie");
  r.w.upsert_process(4343, 1, "copier", "python3 copy.py", "/usr/bin/python3", 0);
  r.steps(20, 0);
  r.windows(3'000'000, kHelper);
  r.gpu(60, {{kPid, 60}, {4343, 0}}, 20'000'000);
  const auto c = causes_of(r);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "pcie_contention");
}

// A GPU-bound job (busy throughout; its thread waits in a sync each step) whose `quiet` steps take
// 8 ms, then 40 more `loaded_ms` while another process ("copier") moves 20 GB/s over the GPU's
// PCIe link, computing on `tenant_sm`% of the SMs meanwhile. One NVML reading a step, of PCIe
// each 10th (NVML's counters are read once a second).
std::vector<diagnose::Finding> findings_beside_a_copier(const std::string& name, double loaded_ms,
                                                       uint32_t tenant_sm = 0, int quiet = 40) {
  CraftedRun r(name);
  r.w.upsert_process(4343, 1, "copier", "python3 copy.py", "/usr/bin/python3", 0);
  uint64_t t = 1'000'000;
  for (int s = 0; s < quiet + 40; ++s) {
    const bool loaded = s >= quiet;
    const auto len = uint64_t((loaded ? loaded_ms : 8.0) * 1e6);
    r.call("cudaMemcpyAsync", kPid, t, 10'000, 0, 4 << 20);
    for (int k = 0; k < 20; ++k) r.call("cudaLaunchKernel", kPid, t + 50'000 + uint64_t(k) * 20'000, 5'000, 0x1000 + k);
    r.call("cudaStreamSynchronize", kPid, t + 600'000, len - 700'000);
    store::ThreadTimeRow w;
    w.pid = w.tid = kPid;
    w.start_ns = t;
    w.end_ns = t + len;
    w.on_cpu_ns = 700'000;
    w.lock_ns = w.blocked_ns = len - 700'000;
    w.waker_tid = w.waker_pid = 0;
    w.state = "on_cpu";
    r.w.add_thread_time(w);
    gpu::NvmlSampler::Batch b;
    gpu::GpuSample g;
    g.ts_ns = t + len / 2;
    g.gpu_util = 100;
    g.sm_clock_mhz = 1980;
    // The job's own 4 MB a step (0.5 GB/s), and the copier's load.
    const uint64_t kbs = (loaded ? 20'000'000'000ull : 0) / 1024 + (4ull << 20) * 1000 / 8 / 1024;
    if (s % 10 == 0) g.pcie_tx_kbs = g.pcie_rx_kbs = uint32_t(kbs / 2);
    b.samples.push_back(g);
    if (s % 5 == 0) {
      b.processes.push_back({g.ts_ns, 0, kPid, loaded && tenant_sm ? 95 - tenant_sm : 95, 0, 1 << 30});
      b.processes.push_back({g.ts_ns, 0, 4343, loaded ? tenant_sm : 0, 0, 1 << 30});
    }
    r.w.add_gpu_batch(b);
    t += len;
  }
  const auto d = diagnosis_of(r);
  return d.processes.empty() ? std::vector<diagnose::Finding>{} : d.processes[0].findings;
}

TEST(DiagnoseFindings, StepsSlowerWhileAnotherProcessCopiesOverPcieNameItWithTheGpuBusy) {
  const auto f = findings_beside_a_copier("pcie_busy", 9.2);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "pcie_contention");
  // 40 steps 1.2 ms longer, of 688 ms.
  EXPECT_NEAR(f[0].share, 48.0 / 688, 0.01);
  EXPECT_NE(f[0].evidence.find("steps taken while PCIe carried 20."), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("15% longer than its 30 steps without that load (8.00 ms)"), std::string::npos)
      << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("copier"), std::string::npos) << f[0].evidence;
}

TEST(DiagnoseFindings, ACopierThatStartsASecondInIsComparedWithTheStepsBefore) {
  // The steps before it, under one reading of the link.
  const auto f = findings_beside_a_copier("pcie_late", 9.2, 0, 20);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "pcie_contention");
  EXPECT_NE(f[0].evidence.find("than its 10 steps without that load"), std::string::npos) << f[0].evidence;
}

TEST(DiagnoseFindings, ACopierThatSlowsNoStepIsNoFinding) {
  const auto f = findings_beside_a_copier("pcie_harmless", 8.0);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "none");
}

TEST(DiagnoseFindings, StepsSlowedByATenantThatAlsoComputesAreGpuContention) {
  const auto f = findings_beside_a_copier("pcie_computing", 9.2, 40);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "gpu_contention");
  for (const auto& x : f) EXPECT_NE(x.cause, "pcie_contention") << x.evidence;
}

TEST(DiagnoseFindings, AWaitPassedOnByAPinMemoryThreadIsTheWorkersInput) {
  // The main thread waits on a queue filled by its pin-memory thread (kHelper), which itself
  // waits on a pipe from a DataLoader worker (pid 300, a child).
  CraftedRun r("relay");
  r.w.upsert_process(300, kPid, "pt_data_worker", "python3 train.py", "/usr/bin/python3", 0);
  r.steps(20);
  r.windows(6'000'000, kHelper);
  for (uint64_t s = 0; s < 40; ++s) {
    store::ThreadTimeRow t;
    t.pid = kPid;
    t.tid = kHelper;
    t.start_ns = 1'000'000 + s * kStepNs;
    t.end_ns = t.start_ns + kStepNs;
    t.on_cpu_ns = 2'000'000;
    t.fd_ns = 8'000'000;
    t.blocked_ns = 8'000'000;
    t.waker_tid = 300;
    t.waker_pid = 300;
    t.state = "fd";
    r.w.add_thread_time(t);
  }
  r.gpu(40, {{kPid, 40}});
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"input_wait"});
}

TEST(DiagnoseFindings, ClocksHeldDownByHeatAreNamed) {
  // Busy 99%, the SM clock at 1400 MHz of the 1980 it reached, thermal slowdown (0x40).
  CraftedRun r("clocks");
  r.steps(20);
  r.windows();
  r.gpu(99, {{kPid, 99}}, 0, 1400, 0x40);
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"gpu_clocks_throttled"});
}

TEST(DiagnoseFindings, TheSoftwarePowerCapIsNoFinding) {
  // Busy GPUs sit at their power cap (0x4) with clocks below the boost they reached.
  CraftedRun r("power_cap");
  r.steps(20);
  r.windows();
  r.gpu(99, {{kPid, 99}}, 0, 1700, 0x4);
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"none"});
}

namespace {

// Kernel times (record --gpu-times) added after the recording, as the recorder adds them: for each
// step's launches (call ids 2..21 of the step's 22 calls), a kernel starting `start(k)` after the
// step began and running `run_ns`.
std::vector<std::string> causes_with_kernels(CraftedRun& r, const std::function<uint64_t(int)>& start,
                                             uint64_t run_ns) {
  r.w.finish();
  {
    store::Db db(r.path, store::Db::Mode::Create);
    db.exec("BEGIN");
    auto q = db.prepare(
        "INSERT INTO gpu_activities(pid, kind, gpu, start_ns, end_ns, call_id) VALUES(?1, 'kernel', 0, ?2, ?3, ?4)");
    for (uint64_t s = 0; s < 40; ++s)
      for (int k = 0; k < 20; ++k) {
        const uint64_t at = 1'000'000 + s * kStepNs + start(k);
        q.bind(1, int64_t(kPid)).bind(2, int64_t(at)).bind(3, int64_t(at + run_ns)).bind(4, int64_t(s * 21 + 2 + k));
        q.run();
      }
    db.exec("COMMIT");
  }
  return causes(r.path);
}

}  // namespace

TEST(DiagnoseFindings, KernelsLaunchedAfterTheGpuRanDryAreTheHostsDoing) {
  // A launch every 450 µs of host work, each kernel starting as soon as it is launched and running
  // 50 µs: the GPU idles ~90% of the step, waiting for launches (HTA's host wait).
  CraftedRun r("host_late");
  for (uint64_t s = 0; s < 40; ++s) {
    const uint64_t t = 1'000'000 + s * kStepNs;
    r.call("cudaMemcpyAsync", kPid, t, 10'000, 0, 4 << 20);
    for (int k = 0; k < 20; ++k) r.call("cudaLaunchKernel", kPid, t + 50'000 + k * 450'000, 5'000, 0x1000 + k);
  }
  r.windows();
  const auto c = causes_with_kernels(r, [](int k) { return 50'000 + k * 450'000 + 5'000; }, 50'000);
  EXPECT_EQ(c, std::vector<std::string>{"host_compute"});
}

TEST(DiagnoseFindings, AGpuIdleWithItsWorkQueuedIsNotTheHostsDoing) {
  // The same launches all made at the step's start, the kernels spread over it with gaps (waits on
  // other work): the GPU idles 90%, but never for want of a launch.
  CraftedRun r("queued");
  for (uint64_t s = 0; s < 40; ++s) {
    const uint64_t t = 1'000'000 + s * kStepNs;
    r.call("cudaMemcpyAsync", kPid, t, 10'000, 0, 4 << 20);
    for (int k = 0; k < 20; ++k) r.call("cudaLaunchKernel", kPid, t + 20'000 + k * 1'000, 500, 0x1000 + k);
  }
  r.windows();
  const auto c = causes_with_kernels(r, [](int k) { return 100'000 + k * 450'000; }, 50'000);
  EXPECT_EQ(c, std::vector<std::string>{"none"});
}

namespace {

// `io_ns` a step blocked in I/O reading a file, and `sys_ns` on a CPU in the kernel; the job's
// cgroup reads back `refault_mb_per_s` of file pages it had evicted.
std::vector<std::string> causes_of_reads(const std::string& name, uint64_t refault_mb_per_s,
                                         uint64_t io_ns = 3'000'000, uint64_t sys_ns = 0) {
  CraftedRun r(name);
  r.steps(4);
  r.windows_where([&](store::ThreadTimeRow& row) {
    row.on_cpu_ns = kStepNs - io_ns;
    row.sys_ns = sys_ns;
    row.io_ns = row.blocked_ns = io_ns;
    row.blocked_syscall = "pread64";
  });
  r.cgroup_readings([&](host::PressureReading& p, uint64_t k) {
    p.memory_some_us = p.memory_full_us = 0;
    p.refault_file = k * refault_mb_per_s * 1'000'000 / 4096 / 10;
  });
  return causes_of(r);
}

}  // namespace

TEST(DiagnoseFindings, ReadsOfPagesTheCacheJustEvictedAreMemoryPressure) {
  // A dataset that no longer fits the job's memory limit: its reads wait on the disk, for pages
  // the cgroup keeps evicting (PSI may show little: the job's other tasks run on).
  EXPECT_EQ(causes_of_reads("refaults", 800), std::vector<std::string>{"memory_pressure"});
  // The same reads of pages never cached before: the disk's.
  EXPECT_EQ(causes_of_reads("cold_reads", 0), std::vector<std::string>{"io_wait"});
  // Read back on a CPU in the kernel (3 ms a step), hardly waiting for the disk: the training
  // step under a memory limit on the H100 (session 29), named launch_bound before.
  auto c = causes_of_reads("refaults_in_kernel", 800, 200'000, 3'000'000);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.front(), "memory_pressure");
  c = causes_of_reads("kernel_no_refaults", 0, 200'000, 3'000'000);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.front(), "host_kernel");
}

TEST(DiagnoseFindings, LaunchesSplitBetweenTheMainAndAutogradThreadsAreLaunchBound) {
  // PyTorch with a tiny batch: the main thread launches the forward pass (4 ms), then waits while
  // autograd's thread launches the backward pass (6 ms, running all along); 100 launches a step,
  // the GPU busy 25%. Neither thread alone runs half the step.
  CraftedRun r("split_launches");
  for (uint64_t s = 0; s < 40; ++s) {
    const uint64_t t = 1'000'000 + s * kStepNs;
    r.call("cudaMemcpyAsync", kPid, t, 10'000, 0, 1 << 20);
    for (int k = 0; k < 40; ++k) r.call("cudaLaunchKernel", kPid, t + 50'000 + k * 90'000, 5'000, 0x1000 + k);
    for (int k = 0; k < 60; ++k) r.call("cudaLaunchKernel", kAutograd, t + 4'000'000 + k * 95'000, 5'000, 0x2000 + k);
    store::ThreadTimeRow a;
    a.pid = kPid;
    a.tid = kAutograd;
    a.start_ns = t + 4'000'000;
    a.end_ns = t + kStepNs;
    a.on_cpu_ns = 6'000'000;
    a.state = "on_cpu";
    r.w.add_thread_time(a);
  }
  r.windows(6'000'000, kAutograd);
  r.gpu(25);
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"launch_bound"});
}

TEST(DiagnoseFindings, UnderAQuotaThrottledMostPeriodsWaitsForItsOwnThreadsAreThrottling) {
  // The main thread waits 3 ms a step for its own threads (the GIL) and 2 ms for an idle CPU;
  // the cgroup was throttled in 90% of its periods: its other threads were held back as well.
  CraftedRun r("quota_locks");
  r.steps(4);
  r.windows_where([](store::ThreadTimeRow& row) {
    row.on_cpu_ns = 5'000'000;
    row.lock_ns = row.blocked_ns = 3'000'000;
    row.waker_tid = kHelper;
    row.waker_pid = kPid;
    row.runnable_ns = row.waited_ns = 2'000'000;
    row.waited_for_tid = row.waited_for_pid = 0;  // the idle task: its CPU had gone idle
  });
  r.cgroup_readings([](host::PressureReading& p, uint64_t k) {
    p.periods = k * 100;
    p.throttled_periods = k * 90;
    p.throttled_us = k * 50'000;
  });
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"cpu_throttling"});
}

namespace {

// 100 launches a step from the main thread, on a CPU all the step, `sys_ns` of it in the kernel,
// blocked in I/O `io_ns`; the GPU 40% busy; the cgroup reading back `refault_mb_per_s`.
std::vector<std::string> causes_with_kernel_time(const std::string& name, uint64_t sys_ns, uint64_t io_ns,
                                                 uint64_t refault_mb_per_s) {
  CraftedRun r(name);
  r.steps(100);
  r.windows_where([&](store::ThreadTimeRow& row) {
    row.on_cpu_ns = kStepNs - io_ns;
    row.sys_ns = sys_ns;
    row.io_ns = row.blocked_ns = io_ns;
    if (io_ns) row.blocked_syscall = "pread64";
  });
  r.cgroup_readings([&](host::PressureReading& p, uint64_t k) {
    p.refault_file = k * refault_mb_per_s * 1'000'000 / 4096 / 10;
  });
  r.gpu(40);
  return causes_of(r);
}

}  // namespace

TEST(DiagnoseFindings, KernelTimeGoesWithWhatItServed) {
  // Re-reading evicted pages: 1 ms a step blocked, 5 ms on a CPU in the kernel copying them back,
  // 4 ms of its own (100 launches at 40 µs would look launch-bound).
  auto c = causes_with_kernel_time("kernel_memory", 5'000'000, 1'000'000, 800);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.front(), "memory_pressure");
  // The same kernel time with nothing it served: a finding of its own, ahead of launching.
  c = causes_with_kernel_time("kernel_alone", 6'000'000, 0, 0);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.front(), "host_kernel");
  // Little kernel time: the launches it is.
  c = causes_with_kernel_time("kernel_little", 200'000, 0, 0);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.front(), "launch_bound");
}

TEST(DiagnoseFindings, ABusyGpuBesideAThreadPartlyInTheKernelIsNoFinding) {
  // The clean CNN on the H100 (session 28): the thread in the kernel a fifth of its busy time,
  // the GPU idle 6%. All of that idle time used to go to the kernel time (host_kernel 6%).
  CraftedRun r("kernel_clean");
  r.steps(4);
  r.windows_where([&](store::ThreadTimeRow& w) { w.sys_ns = 2'000'000; });
  r.gpu(94, {{kPid, 94}});
  EXPECT_EQ(causes_of(r), std::vector<std::string>{"none"});
}

TEST(DiagnoseFindings, SystemTimeUnderAStormOfPacketsIsTheStorms) {
  // 100 launches a step; the thread on a CPU all the step, 1.5 ms of it in softirqs and 4.5 ms in
  // system time (the interrupts that bring the packets: the loopback flood on the H100 VM), the
  // GPU busy 40%. Its own work is 4 ms a step: the packets take the GPU's idle time, not launching.
  auto run = [](const char* name, uint64_t softirq_ns, uint64_t sys_ns) {
    CraftedRun r(name);
    r.steps(100);
    r.windows_where([&](store::ThreadTimeRow& w) {
      w.net_softirq_ns = softirq_ns;
      w.sys_ns = sys_ns;
    });
    r.gpu(40, {{kPid, 40}});
    return diagnosis_of(r);
  };
  auto d = run("storm", 1'500'000, 4'500'000);
  ASSERT_FALSE(d.processes.empty());
  auto f = d.processes[0].findings;
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "softirq");
  EXPECT_NEAR(f[0].share, 0.45, 0.01);  // the softirqs and the system time beyond them
  EXPECT_NE(f[0].evidence.find("3.0 ms a step more"), std::string::npos) << f[0].evidence;
  // Softirqs 3% of its time: no storm; its system time beyond them is its own (host_kernel),
  // sharing the GPU's idle time with its launching in proportion to the two.
  d = run("calm", 300'000, 4'500'000);
  f = d.processes[0].findings;
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f[0].cause, "launch_bound");
  EXPECT_EQ(f[1].cause, "host_kernel");
  EXPECT_NEAR(f[1].share, 0.6 * 4.2 / 9.7, 0.03);
}

TEST(DiagnoseFindings, RetransmitsOnTheWayToARemoteSourceAreInTheEvidence) {
  // 4 ms a step blocked receiving from a remote server (woken from the network, by no process)
  // while the job's network namespace retransmits 5% of its TCP segments.
  CraftedRun r("retransmits");
  r.steps(4);
  r.windows_where([](store::ThreadTimeRow& row) {
    row.on_cpu_ns = kStepNs - 4'000'000;
    row.fd_ns = row.blocked_ns = 4'000'000;
    row.blocked_syscall = "recvfrom";
    row.blocked_on = "tcp 10.0.0.7:41234 -> 10.0.0.9:5000";
  });
  r.cgroup_readings([](host::PressureReading& p, uint64_t k) {
    p.tcp_out_segs = k * 2000;
    p.tcp_retrans_segs = k * 100;
  });
  const auto d = diagnosis_of(r);
  ASSERT_EQ(d.processes.size(), 1u);
  const auto& f = d.processes[0].findings;
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "input_wait");
  EXPECT_NE(f[0].evidence.find("recvfrom (on tcp 10.0.0.7:41234 -> 10.0.0.9:5000)"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("TCP retransmitted 5% of the segments sent from its network namespace (1000 a second)"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_NE(f[0].fix.find("network path"), std::string::npos) << f[0].fix;
}

namespace {

// The GPU (busy 95%) reports `xid` at the 30th of the 40 steps.
std::vector<diagnose::Finding> findings_with_xid(const std::string& name, uint32_t xid) {
  CraftedRun r(name);
  r.steps(4);
  r.windows();
  r.gpu(99);
  gpu::NvmlSampler::Batch b;
  b.events.push_back({1'000'000 + 30 * kStepNs, 0, "xid", xid});
  r.w.add_gpu_batch(b);
  const auto d = diagnosis_of(r);
  return d.processes.empty() ? std::vector<diagnose::Finding>{} : d.processes[0].findings;
}

}  // namespace

TEST(DiagnoseFindings, AGpuThatFellOffTheBusComesFirst) {
  const auto f = findings_with_xid("xid79", 79);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "gpu_error");
  EXPECT_EQ(f[0].title, "The GPU reported a hardware fault");
  EXPECT_NE(f[0].evidence.find("Xid 79 (the GPU has fallen off the bus"), std::string::npos) << f[0].evidence;
  EXPECT_NEAR(f[0].share, 9.0 / 39, 0.03);  // the steps after it
  // A program's own fault is named too, with what to run to find the kernel.
  const auto g = findings_with_xid("xid31", 31);
  ASSERT_FALSE(g.empty());
  EXPECT_EQ(g[0].cause, "gpu_error");
  EXPECT_NE(g[0].fix.find("compute-sanitizer"), std::string::npos);
}

namespace {

// 40 steps of 10 ms, each blocked 3 ms on a lock another thread of the job ends (29% of the run);
// the steps in `slow` 16 ms, asleep 6 ms more. `slow_util` >= 0: NVML reads the GPU busy in each
// step, fully but in the slow ones (that share).
diagnose::Diagnosis diagnosis_with_slow_steps(const std::string& name, const std::set<uint64_t>& slow,
                                              diagnose::SlowSteps ranking, int slow_util = -1) {
  CraftedRun r(name);
  uint64_t t = 1'000'000;
  for (uint64_t s = 0; s < 40; ++s) {
    const bool is_slow = slow.contains(s);
    const uint64_t len = is_slow ? 16'000'000 : kStepNs, sleep = is_slow ? 6'000'000 : 0;
    r.call("cudaMemcpyAsync", kPid, t, 10'000, 0, 4 << 20);
    for (int k = 0; k < 3; ++k) r.call("cudaLaunchKernel", kPid, t + 50'000 + k * 20'000, 5'000, 0x1000 + k);
    store::ThreadTimeRow w;
    w.pid = w.tid = kPid;
    w.start_ns = t;
    w.end_ns = t + len;
    w.lock_ns = 3'000'000;
    w.sleep_ns = sleep;
    w.blocked_ns = w.lock_ns + sleep;
    w.on_cpu_ns = len - w.blocked_ns;
    w.waker_tid = kHelper;
    w.waker_pid = kPid;
    w.state = "on_cpu";
    r.w.add_thread_time(w);
    if (slow_util >= 0) r.gpu_reading(t + len / 2, is_slow ? uint32_t(slow_util) : 100);
    t += len;
  }
  return r.diagnosed(ranking);
}

bool has_cause(const diagnose::Diagnosis& d, const std::string& cause) {
  for (const auto& p : d.processes)
    for (const auto& f : p.findings)
      if (f.cause == cause) return true;
  return false;
}

}  // namespace

TEST(DiagnoseFindings, ACauseOfAFewSlowStepsRanksByTheTimeItExplainsOverAll) {
  // Two slow steps: over a third of those two, 3% of the run. The lock explains more of the job's
  // time and comes first; the sleep is still told, with its share of the slow steps.
  const auto d = diagnosis_with_slow_steps("slow_steps", {12, 27}, diagnose::SlowSteps::RankedOverAll);
  ASSERT_EQ(d.processes.size(), 1u);
  const auto& f = d.processes[0].findings;
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].cause, "lock_wait");
  EXPECT_EQ(f[1].cause, "sleep");
  EXPECT_NEAR(f[1].share, 12.0 / 412, 0.01);
  EXPECT_NE(f[1].evidence.find("in the 2 slow steps (8% of the time), 3"), std::string::npos)
      << f[1].evidence;
}

TEST(DiagnoseFindings, LiveAFewSlowStepsHereAndThereSayNothingButARunOfThemAtTheEndDoes) {
  // Ranked among themselves (the agent's recent window), the slow steps' cause is told when they
  // weigh: two scattered ones (3% of the time over the median) are a healthy job's noise; the
  // same slowness in the last seven steps seen whole (112 ms; the 40th is not whole) is something
  // that has just begun, in the last three (48 ms) the tail of a hiccup.
  EXPECT_FALSE(has_cause(diagnosis_with_slow_steps("scattered", {12, 27}, diagnose::SlowSteps::RankedAmongThemselves),
                         "sleep"));
  EXPECT_TRUE(has_cause(diagnosis_with_slow_steps("onset", {32, 33, 34, 35, 36, 37, 38, 39},
                                                  diagnose::SlowSteps::RankedAmongThemselves),
                        "sleep"));
  EXPECT_FALSE(has_cause(
      diagnosis_with_slow_steps("tail", {36, 37, 38, 39}, diagnose::SlowSteps::RankedAmongThemselves), "sleep"));
  // One hiccup: five slow steps in a row mid-window, 7% of the time over the median, all within
  // 80 ms, the only time the GPU idled (30% of them; 4% of the window: less than a finding).
  EXPECT_FALSE(has_cause(diagnosis_with_slow_steps("hiccup", {20, 21, 22, 23, 24},
                                                   diagnose::SlowSteps::RankedAmongThemselves, 70),
                         "sleep"));
  // Gone on a while (8 slow steps, 12% of the time over the median, over 330 ms), scattered or not.
  EXPECT_TRUE(has_cause(diagnosis_with_slow_steps("a_while", {3, 8, 13, 18, 23, 28, 33, 36},
                                                  diagnose::SlowSteps::RankedAmongThemselves),
                        "sleep"));
}

TEST(DiagnoseFindings, LiveSlowStepsOfALaunchBoundJobAreNotASecondCause) {
  // 100 launches a 10 ms step, on a CPU throughout, the GPU half idle: launch-bound. The last four
  // steps take 20 ms for the same launches: slower per launch (host_compute by the host time a
  // launch takes), but the same cause, not another above it.
  CraftedRun r("launch_bound_slow");
  uint64_t t = 1'000'000;
  for (uint64_t s = 0; s < 40; ++s) {
    const uint64_t len = s >= 36 ? 2 * kStepNs : kStepNs;
    r.call("cudaMemcpyAsync", kPid, t, 10'000, 0, 4 << 20);
    for (uint64_t k = 0; k < 100; ++k)
      r.call("cudaLaunchKernel", kPid, t + 50'000 + k * (len / 101), 5'000, 0x1000 + k);
    store::ThreadTimeRow w;
    w.pid = w.tid = kPid;
    w.start_ns = t;
    w.end_ns = t + len;
    w.on_cpu_ns = len;
    w.state = "on_cpu";
    r.w.add_thread_time(w);
    r.gpu_reading(t + len / 2, 50);
    t += len;
  }
  const auto d = r.diagnosed(diagnose::SlowSteps::RankedAmongThemselves);
  ASSERT_EQ(d.processes.size(), 1u);
  const auto& f = d.processes[0].findings;
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "launch_bound");
  EXPECT_FALSE(has_cause(d, "host_compute"));
}

TEST(DiagnoseFindings, KernelTimeSaysWhatTheThreadDidThereFromItsSamples) {
  // 6 ms a step in the kernel, nothing it served; the CPU samples found the thread in page faults
  // twice as often as in futex.
  CraftedRun r("kernel_said");
  r.steps(100);
  r.windows_where([&](store::ThreadTimeRow& row) { row.sys_ns = 6'000'000; });
  r.kernel_samples(2, {"clear_page_erms", "do_anonymous_page", "handle_mm_fault", "do_user_addr_fault",
                       "exc_page_fault", "asm_exc_page_fault"});
  r.kernel_samples(1, {"futex_wait_queue", "futex_wait", "do_futex", "__x64_sys_futex", "do_syscall_64",
                       "entry_SYSCALL_64_after_hwframe"});
  r.gpu(40);
  const auto d = r.diagnosed(diagnose::SlowSteps::RankedOverAll);
  ASSERT_FALSE(d.processes.empty());
  const auto& f = d.processes[0].findings.front();
  EXPECT_EQ(f.cause, "host_kernel");
  EXPECT_NE(f.evidence.find("its CPU samples there: 67% in page faults, 33% in futex system calls"), std::string::npos)
      << f.evidence;
}

TEST(DiagnoseFindings, AKernelStackSaysWhatTheThreadWasDoingThere) {
  using diagnose::kernel_activity;
  // A system call, by the outermost wrapper named (a device's interrupt within it is its time).
  EXPECT_EQ(kernel_activity({"copy_user_generic", "asm_sysvec_apic_timer_interrupt", "ksys_read", "__x64_sys_read",
                             "do_syscall_64", "entry_SYSCALL_64_after_hwframe"}),
            "read");
  EXPECT_EQ(kernel_activity({"futex_wait", "__se_sys_futex.isra.0", "do_syscall_64"}), "futex");
  EXPECT_EQ(kernel_activity({"clear_page_erms", "handle_mm_fault", "exc_page_fault", "asm_exc_page_fault"}),
            "page faults");
  EXPECT_EQ(kernel_activity({"net_rx_action", "handle_softirqs", "irq_exit_rcu", "sysvec_apic_timer_interrupt",
                             "asm_sysvec_apic_timer_interrupt"}),
            "interrupts");
  // Older kernels' entries.
  EXPECT_EQ(kernel_activity({"clear_page_erms", "__do_page_fault", "do_page_fault", "page_fault"}), "page faults");
  EXPECT_EQ(kernel_activity({"net_rx_action", "__do_softirq", "irq_exit", "smp_apic_timer_interrupt",
                             "apic_timer_interrupt"}),
            "interrupts");
  EXPECT_EQ(kernel_activity({"schedule", "", "0xffffffff81000000"}), "");
  EXPECT_EQ(kernel_activity({}), "");
}

TEST(DiagnoseFindings, ALoopOfMemsetsAloneIsDiagnosed) {
  // 30 cudaMemsetAsync a step, then 4 ms of host work: a process that drives a GPU, its steps cut
  // at the host's gaps.
  CraftedRun r("memsets");
  for (uint64_t s = 0; s < 40; ++s)
    for (uint64_t k = 0; k < 30; ++k) r.call("cudaMemsetAsync", kPid, 1'000'000 + s * kStepNs + k * 5'000, 2'000);
  const auto d = r.diagnosed(diagnose::SlowSteps::RankedOverAll);
  ASSERT_EQ(d.processes.size(), 1u);
  EXPECT_EQ(d.processes[0].steps.count(), 38u);
}
