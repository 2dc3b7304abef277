// diagnose's rules on crafted records: who ended a wait decides what it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <functional>

#include "cuda/functions.h"
#include "diagnose/analysis.h"
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
  // NVML: a reading of the GPU a step, busy `util` (0..100); per-process readings each 10th step.
  void gpu(uint32_t util, std::vector<std::pair<uint32_t, uint32_t>> sm = {}, uint32_t pcie_kbs = 0,
           uint32_t clock_mhz = 1980, uint64_t throttle = 0) {
    for (uint64_t s = 0; s < 40; ++s) {
      gpu::NvmlSampler::Batch b;
      gpu::GpuSample g;
      g.ts_ns = 1'000'000 + s * kStepNs + 5'000'000;
      g.gpu_util = util;
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

std::vector<std::string> causes(const std::string& path) {
  store::RecordReader reader(path);
  const auto d = diagnose::diagnose(reader);
  std::vector<std::string> out;
  for (const auto& p : d.processes)
    for (const auto& f : p.findings) out.push_back(f.cause);
  std::filesystem::remove(path);
  return out;
}

std::vector<std::string> causes_of(CraftedRun& r) {
  r.w.finish();
  return causes(r.path);
}

// The main thread copies in and launches, the autograd thread launches; the main thread blocks
// 5 ms a step in futex, ended by `waker` (a thread of the process).
std::vector<std::string> causes_with_waits(const std::string& name, uint32_t waker) {
  CraftedRun r(name);
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
