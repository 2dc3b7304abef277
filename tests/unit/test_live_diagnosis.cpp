// The agent's live diagnosis fed as the aggregator feeds it: a loop's calls and its thread's
// windows, NVML's readings; what it exports and which findings it tells as they begin.
#include <gtest/gtest.h>

#include "agent/live_diagnosis.h"
#include "cuda/functions.h"

using namespace gpuscope;

namespace {

// Tests of what the analysis finds in a loop, from its first step on (no start-up left out).
const agent::LiveDiagnosis::Limits kNoWarmup{.skip_start_up = false};

constexpr uint32_t kPid = 500;
constexpr uint64_t kStepNs = 10'000'000;

// A call of the loop's main thread at `ts_ns`, 5 us long.
void add_call(agent::LiveDiagnosis& live, const char* fn, uint64_t ts_ns, uint64_t handle = 0) {
  CallEvent e;
  e.func = cuda::function_by_symbol(fn)->id;
  e.pid = e.tid = kPid;
  e.comm = "python3";
  e.ts_ns = ts_ns;
  e.duration_ns = 5'000;
  e.has_return = true;
  e.kernel_handle = handle;
  live.add_call(e);
}

// A step's calls from `t`: a copy in and two launches.
void add_step_calls(agent::LiveDiagnosis& live, uint64_t t) {
  add_call(live, "cudaMemcpyAsync", t);
  add_call(live, "cudaLaunchKernel", t + 100'000, 0xa0);
  add_call(live, "cudaLaunchKernel", t + 200'000, 0xb0);
}

// `seconds` of a loop from `from_ns`: a copy and two launches a step; its main thread sleeps
// `sleep_ns` of each step, or is runnable `throttled_ns` of it while its CPU is idle.
// `calls`: false while the overhead budget has the launch and copy probes off (none is seen).
void feed_loop(agent::LiveDiagnosis& live, uint64_t from_ns, double seconds, uint64_t sleep_ns,
               uint64_t throttled_ns = 0, bool calls = true) {
  const auto steps = uint64_t(seconds * 1e9 / kStepNs);
  for (uint64_t s = 0; s < steps; ++s) {
    const uint64_t t = from_ns + s * kStepNs;
    if (calls) add_step_calls(live, t);
    store::ThreadTimeRow r;
    r.pid = kPid;
    r.tid = kPid;
    r.start_ns = t;
    r.end_ns = t + kStepNs;
    r.on_cpu_ns = kStepNs - sleep_ns - throttled_ns;
    r.sleep_ns = sleep_ns;
    r.runnable_ns = throttled_ns;
    r.waited_ns = throttled_ns;  // behind the idle task (tid 0): its CPU had gone idle
    r.state = "on_cpu";
    live.add_thread_time(r);
  }
}

// The main thread's window of the step from `t`: on a CPU all of it, `sys_ns` in the kernel.
void add_busy_step(agent::LiveDiagnosis& live, uint64_t t, uint64_t sys_ns) {
  store::ThreadTimeRow r;
  r.pid = r.tid = kPid;
  r.start_ns = t;
  r.end_ns = t + kStepNs;
  r.on_cpu_ns = kStepNs;
  r.sys_ns = sys_ns;
  r.state = "on_cpu";
  live.add_thread_time(r);
}

void feed_gpu(agent::LiveDiagnosis& live, uint64_t from_ns, double seconds, uint32_t util) {
  for (uint64_t t = from_ns; t < from_ns + uint64_t(seconds * 1e9); t += 100'000'000) {
    gpu::NvmlSampler::Batch b;
    gpu::GpuSample s;
    s.ts_ns = t;
    s.gpu_util = util;
    b.samples.push_back(s);
    live.add_gpu_batch(b);
  }
}

std::vector<std::string> causes(const agent::LiveDiagnosis& live) {
  std::vector<std::string> out;
  for (const auto& c : live.current())
    for (const auto& f : c.findings) out.push_back(f.cause);
  return out;
}

}  // namespace

TEST(LiveDiagnosis, AFindingIsToldOnceAsItBegins) {
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  feed_loop(live, t0, 3, 0);
  live.tick(t0 + 3'000'000'000);
  EXPECT_TRUE(causes(live).empty());
  EXPECT_TRUE(live.take_onsets().empty());

  feed_loop(live, t0 + 3'000'000'000, 3, 5'000'000);
  live.tick(t0 + 6'000'000'000);
  EXPECT_EQ(causes(live), std::vector<std::string>{"sleep"});
  const auto onsets = live.take_onsets();
  ASSERT_EQ(onsets.size(), 1u);
  EXPECT_EQ(onsets[0].pid, kPid);
  EXPECT_EQ(onsets[0].finding.cause, "sleep");
  EXPECT_EQ(onsets[0].ts_ns, t0 + 6'000'000'000);

  // Still there a second later: not told again.
  feed_loop(live, t0 + 6'000'000'000, 1, 5'000'000);
  live.tick(t0 + 7'000'000'000);
  EXPECT_EQ(causes(live), std::vector<std::string>{"sleep"});
  EXPECT_TRUE(live.take_onsets().empty());
}

TEST(LiveDiagnosis, NvmlReadingsOfABusyGpuOutweighAHostWait) {
  // The same sleep while the only GPU is busy 99% of the time costs the loop nothing.
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  feed_loop(live, t0, 3, 5'000'000);
  feed_gpu(live, t0, 3, 99);
  live.tick(t0 + 3'000'000'000);
  ASSERT_EQ(live.current().size(), 1u);
  EXPECT_TRUE(causes(live).empty());
  // And while it idles, the sleep is the cause again.
  feed_loop(live, t0 + 3'000'000'000, 3, 5'000'000);
  feed_gpu(live, t0 + 3'000'000'000, 3, 40);
  live.tick(t0 + 6'000'000'000);
  EXPECT_EQ(causes(live), std::vector<std::string>{"sleep"});
}

TEST(LiveDiagnosis, ACgroupsThrottlingIsCitedLive) {
  // A loop runnable half of each step while its CPU is idle (quota throttling), and its cgroup's
  // cpu.stat read twice a second: the finding cites the cgroup's own count.
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  feed_loop(live, t0, 3, 0, kStepNs / 2);
  for (uint64_t k = 0; k <= 6; ++k) {
    host::PressureReading p;
    p.ts_ns = t0 + k * 500'000'000;
    p.pid = kPid;
    p.cgroup = "/job";
    p.periods = 5 * k;
    p.throttled_periods = 5 * k;
    p.throttled_us = 250'000 * k;
    live.add_pressure(p);
  }
  live.tick(t0 + 3'000'000'000);
  const auto cur = live.current();
  ASSERT_EQ(cur.size(), 1u);
  ASSERT_FALSE(cur[0].findings.empty());
  const auto& f = cur[0].findings[0];
  EXPECT_EQ(f.cause, "cpu_throttling");
  EXPECT_NE(f.evidence.find("cpu.stat: its cgroup (/job) was throttled in 100% of its quota periods, 500 ms a second"),
            std::string::npos)
      << f.evidence;
}

TEST(LiveDiagnosis, TimeWithTheLaunchProbesOffHoldsNoStepButItsHostTimeCounts) {
  // A loop whose launch and copy probes the budget switched off for a second, in which its thread
  // slept half the time: the step that spans that second (from the last launch seen to the next)
  // is no step, while the thread's time then, seen whole by the host telemetry, counts at the
  // steps' pace: the sleep explains half of that second, a sixth of the three.
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000, s = 1'000'000'000;
  feed_loop(live, t0, 1, 0);
  live.high_rate_probes(kPid, false, t0 + s);
  feed_loop(live, t0 + s, 1, 5'000'000, 0, false);
  live.high_rate_probes(kPid, true, t0 + 2 * s);
  feed_loop(live, t0 + 2 * s, 1, 0);
  live.tick(t0 + 3 * s);
  auto cur = live.current();
  ASSERT_EQ(cur.size(), 1u);
  EXPECT_NEAR(cur[0].step_s, 0.01, 1e-6);
  EXPECT_GE(cur[0].steps, 190u);
  ASSERT_EQ(cur[0].findings.size(), 1u);
  EXPECT_EQ(cur[0].findings[0].cause, "sleep");
  EXPECT_NEAR(cur[0].findings[0].share, 1.0 / 6, 0.02);

  // Off again for longer than the window: nothing whole to analyse, the last analysis stays.
  live.high_rate_probes(kPid, false, t0 + 3 * s);
  feed_loop(live, t0 + 3 * s, 4, 5'000'000, 0, false);
  live.tick(t0 + 7 * s);
  cur = live.current();
  ASSERT_EQ(cur.size(), 1u);
  EXPECT_NEAR(cur[0].step_s, 0.01, 1e-6);
  EXPECT_EQ(cur[0].analysed_ns, t0 + 3 * s);
}

namespace {

// 3 s of a loop of 100 launches a 10 ms step, each launch a runtime call with the driver's call
// within it; its main thread on a CPU throughout, 1.6 ms of each step in the kernel (the probes'
// traps and programs are system time); the GPU busy 85% of the time.
void feed_launch_loop(agent::LiveDiagnosis& live, uint64_t from_ns) {
  for (uint64_t s = 0; s < 300; ++s) {
    const uint64_t t = from_ns + s * kStepNs;
    for (uint64_t k = 0; k < 100; ++k) {
      CallEvent e;
      e.pid = e.tid = kPid;
      e.comm = "python3";
      e.has_return = true;
      e.kernel_handle = 0xa0 + k;
      e.call_id = s * 1000 + k * 2 + 1;
      e.func = cuda::function_by_symbol("cuLaunchKernel")->id;
      e.parent_id = e.call_id + 1;
      e.ts_ns = t + k * 100'000 + 2'000;
      e.duration_ns = 6'000;
      live.add_call(e);
      e.func = cuda::function_by_symbol("cudaLaunchKernel")->id;
      e.call_id = e.parent_id;
      e.parent_id = 0;
      e.ts_ns = t + k * 100'000;
      e.duration_ns = 10'000;
      live.add_call(e);
    }
    add_busy_step(live, t, 1'600'000);
  }
  feed_gpu(live, from_ns, 3, 85);
}

}  // namespace

TEST(LiveDiagnosis, GpuIdleTimeTheProbesAccountForIsNoFinding) {
  // Without the probes' cost known, the GPU's idle 15% is the job's doing (its launching, and a
  // part of that in proportion, its time in the kernel).
  agent::LiveDiagnosis unknown(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  feed_launch_loop(unknown, t0);
  unknown.tick(t0 + 3'000'000'000);
  EXPECT_EQ(causes(unknown), std::vector<std::string>{"launch_bound"});
  // Two probed calls a launch at 8 µs each add 1.6 ms to a 10 ms step: the idle time is theirs,
  // and so is the system time they were counted in.
  agent::LiveDiagnosis known(kNoWarmup);
  known.set_probe_costs(3'000, 8'000);
  feed_launch_loop(known, t0);
  known.tick(t0 + 3'000'000'000);
  ASSERT_EQ(known.current().size(), 1u);
  EXPECT_TRUE(causes(known).empty()) << causes(known)[0];
}

TEST(LiveDiagnosis, AThreadThatKeepsItsCpuIsNotTakenAsStillWaitingForIt) {
  // The loop's last window ended as it was preempted, 2 s before the analysis; it has run since (a
  // thread on its CPU sends no window until it leaves it or a profile sample comes). Those 2 s are
  // not time it waited for a CPU.
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  feed_loop(live, t0, 1, 0);
  store::ThreadTimeRow last;
  last.pid = last.tid = kPid;
  last.start_ns = t0 + 1'000'000'000;
  last.end_ns = last.start_ns + kStepNs;
  last.on_cpu_ns = kStepNs - 100'000;
  last.runnable_ns = 100'000;
  last.state = "runnable";
  live.add_thread_time(last);
  for (uint64_t s = 101; s < 300; ++s) add_step_calls(live, t0 + s * kStepNs);
  live.tick(t0 + 3'000'000'000);
  ASSERT_EQ(live.current().size(), 1u);
  EXPECT_TRUE(causes(live).empty()) << causes(live)[0];
}

TEST(LiveDiagnosis, SyncsSeenWhileTheLaunchProbesAreOffDoNotHideTheSteps) {
  // A loop that synchronises every step (an .item()): its syncs' probes stay on, its launches' and
  // copies' are on for 0.4 s of the 3 s. The steps are found in the time they were all seen.
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  for (uint64_t s = 0; s < 300; ++s) {
    const uint64_t t = t0 + s * kStepNs;
    const bool on = s >= 200 && s < 240;
    if (s == 0 || s == 200 || s == 240) live.high_rate_probes(kPid, on, t);
    if (on) add_step_calls(live, t);
    add_call(live, "cudaStreamSynchronize", t + 300'000);
    store::ThreadTimeRow r;
    r.pid = r.tid = kPid;
    r.start_ns = t;
    r.end_ns = t + kStepNs;
    r.on_cpu_ns = kStepNs - 5'000'000;
    r.sleep_ns = 5'000'000;
    r.state = "on_cpu";
    live.add_thread_time(r);
  }
  live.tick(t0 + 3'000'000'000);
  ASSERT_EQ(live.current().size(), 1u);
  EXPECT_GT(live.current()[0].steps, 30u);
  EXPECT_EQ(causes(live), std::vector<std::string>{"sleep"});
}

namespace {

// 3 s of the loop, its main thread runnable 3 ms of each step behind `holder` (a process, or a
// kernel thread; 0: none seen, its waits not ended within their windows).
std::vector<diagnose::Finding> findings_when_held_by(uint32_t holder, bool kernel_thread = false) {
  const uint64_t t0 = 1'000'000'000;
  agent::LiveDiagnosis held(kNoWarmup);
  for (uint64_t s = 0; s < 300; ++s) {
    const uint64_t t = t0 + s * kStepNs;
    add_step_calls(held, t);
    store::ThreadTimeRow r;
    r.pid = r.tid = kPid;
    r.start_ns = t;
    r.end_ns = t + kStepNs;
    r.on_cpu_ns = kStepNs - 3'000'000;
    r.runnable_ns = 3'000'000;
    r.waited_ns = holder ? 3'000'000 : 0;
    r.waited_for_pid = r.waited_for_tid = holder;
    r.waited_for_comm = kernel_thread ? "kworker/0:1" : "holder";
    r.waited_for_kthread = kernel_thread;
    r.state = "on_cpu";
    held.add_thread_time(r);
  }
  held.tick(t0 + 3'000'000'000);
  return held.current().empty() ? std::vector<diagnose::Finding>{} : held.current()[0].findings;
}

std::vector<std::string> causes_when_held_by(uint32_t holder) {
  std::vector<std::string> out;
  for (const auto& f : findings_when_held_by(holder)) out.push_back(f.cause);
  return out;
}

}  // namespace

TEST(LiveDiagnosis, AWaitForACpuSaysWhoHeldIt) {
  auto evidence = [](uint32_t holder) {
    const auto f = findings_when_held_by(holder);
    return f.size() == 1 && f[0].cause == "cpu_contention" ? f[0].evidence : std::string("(no cpu_contention)");
  };
  EXPECT_NE(evidence(4242).find("held mostly by holder (pid 4242) (100% of that wait)"), std::string::npos)
      << evidence(4242);
  EXPECT_NE(evidence(kPid).find("held by its own threads (100% of that wait)"), std::string::npos) << evidence(kPid);
  // Its waits did not end within the windows that saw them: nobody is named.
  EXPECT_NE(evidence(0).find("no other process was seen holding its CPU"), std::string::npos) << evidence(0);
  // The fix names the process to move, not the sentence that found it.
  EXPECT_NE(findings_when_held_by(4242)[0].fix.find("or move or renice holder (pid 4242)"), std::string::npos);
}

TEST(LiveDiagnosis, AKernelThreadHoldingTheCpuIsNamedAsOneWithAFixThatCanWork) {
  // A kworker cannot be reniced or moved off a CPU it is bound to.
  const auto f = findings_when_held_by(4243, true);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].cause, "cpu_contention");
  EXPECT_NE(f[0].evidence.find("held mostly by kworker/0:1 (pid 4243), a kernel thread (100% of that wait)"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_EQ(f[0].fix.find("move or renice"), std::string::npos) << f[0].fix;
  EXPECT_NE(f[0].fix.find("perf record -g -p 4243"), std::string::npos) << f[0].fix;
}

TEST(LiveDiagnosis, TheCpuGpuscopeItselfHeldIsNotContention) {
  // The agent (this process) preempting the loop costs it time, but that is gpuscope's overhead,
  // kept within its budget apart: not a cause in the job's host to fix.
  EXPECT_EQ(causes_when_held_by(4242), std::vector<std::string>{"cpu_contention"});
  EXPECT_TRUE(causes_when_held_by(uint32_t(getpid())).empty());
}

TEST(LiveDiagnosis, AStartUpsKernelRegistrationsDoNotWeighOnTheProbesCostOfTheLoopsCalls) {
  // 500,000 kernel registrations at start-up (entry hits of calls not kept, at 30 us each here):
  // counted for good, they would make each of the loop's calls look 5 ms dearer and the probes
  // explain all of the GPU's idle time. Ten seconds into the loop, its 3 ms sleep a step is the cause.
  agent::LiveDiagnosis live(kNoWarmup);
  live.set_probe_costs(30'000, 8'000);
  const uint64_t t0 = 1'000'000'000;
  add_call(live, "cudaLaunchKernel", t0 - 10'000'000, 0xa0);  // the process is known
  CallEvent reg;
  reg.func = cuda::function_by_symbol("__cudaRegisterFunction")->id;
  reg.pid = reg.tid = kPid;
  for (int i = 0; i < 500'000; ++i) live.add_call(reg);
  for (uint64_t s = 0; s < 10; ++s) {
    feed_loop(live, t0 + s * 1'000'000'000, 1, 3'000'000);
    feed_gpu(live, t0 + s * 1'000'000'000, 1, 60);
    live.tick(t0 + (s + 1) * 1'000'000'000);
  }
  const auto found = causes(live);
  ASSERT_FALSE(found.empty());
  EXPECT_EQ(found[0], "sleep");
}

namespace {

void add_xid(agent::LiveDiagnosis& live, uint64_t ts_ns, uint32_t xid, uint32_t device = 0) {
  gpu::NvmlSampler::Batch b;
  b.events.push_back({ts_ns, device, "xid", xid});
  live.add_gpu_batch(b);
}

}  // namespace

TEST(LiveDiagnosis, AGpuThatFailedIsNamedFirstAndStaysNamedWhileItsProcessHangs) {
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  feed_gpu(live, t0, 3, 40);
  feed_loop(live, t0, 3, 5'000'000);  // a slowness of its own: sleep
  add_xid(live, t0 + 2'500'000'000, 79);
  live.tick(t0 + 3'000'000'000);
  const auto now = causes(live);
  ASSERT_EQ(now.size(), 2u);
  EXPECT_EQ(now[0], "gpu_error");  // fatal: before the sleep, whatever its share
  EXPECT_EQ(now[1], "sleep");
  const auto f = live.current()[0].findings[0];
  EXPECT_NE(f.evidence.find("Xid 79"), std::string::npos) << f.evidence;
  EXPECT_EQ(f.title, "The GPU reported a hardware fault");
  const auto onsets = live.take_onsets();
  ASSERT_EQ(onsets.size(), 2u);

  // Its process hangs in a call that never returns: no call, no step, for 40 s. The finding
  // stands, once told, its share the whole window (the report came before it).
  for (uint64_t s = 4; s <= 43; ++s) live.tick(t0 + s * 1'000'000'000);
  ASSERT_EQ(causes(live), std::vector<std::string>{"gpu_error"});
  EXPECT_EQ(live.current()[0].steps, 0u);
  EXPECT_DOUBLE_EQ(live.current()[0].findings[0].share, 1.0);
  EXPECT_TRUE(live.take_onsets().empty());
  // No step time is exported for it, the finding is.
  const auto fams = live.families([](uint32_t) { return agent::Labels{}; });
  EXPECT_TRUE(fams[0].samples.empty());
  ASSERT_EQ(fams[1].samples.size(), 1u);

  // A minute after the report, it is gone.
  live.tick(t0 + 63'000'000'000);
  EXPECT_TRUE(causes(live).empty());
}

TEST(LiveDiagnosis, AnErrorInTheProgramsWorkRanksByItsShareAndOnlyOnItsGpu) {
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  // Two GPUs; NVML saw the loop on GPU 1. An XID on GPU 0 is another job's.
  for (uint32_t device : {0u, 1u}) {
    gpu::NvmlSampler::Batch b;
    gpu::GpuSample s;
    s.ts_ns = t0;
    s.device = device;
    s.gpu_util = 40;
    b.samples.push_back(s);
    live.add_gpu_batch(b);
  }
  feed_loop(live, t0, 3, 5'000'000);
  {
    gpu::NvmlSampler::Batch b;
    b.processes.push_back({.ts_ns = t0 + 100, .device = 1, .pid = kPid});
    live.add_gpu_batch(b);
  }
  add_xid(live, t0 + 2'000'000'000, 13, 0);
  live.tick(t0 + 3'000'000'000);
  EXPECT_EQ(causes(live), std::vector<std::string>{"sleep"});

  // Xid 13 (a graphics engine exception: the program's kernel faulted) on its GPU, in the last
  // third of the window: ranked by that share, below the sleep's half of each step.
  add_xid(live, t0 + 2'000'000'000, 13, 1);
  live.tick(t0 + 3'000'000'000);
  EXPECT_EQ(causes(live), (std::vector<std::string>{"sleep", "gpu_error"}));
  const auto f = live.current()[0].findings[1];
  EXPECT_NEAR(f.share, 1.0 / 3, 0.01);
  EXPECT_EQ(f.title, "The GPU reported an error in the program's work");
}

TEST(LiveDiagnosis, KernelTimeIsSaidWithWhatTheSamplesFoundThere) {
  agent::LiveDiagnosis live(kNoWarmup);
  const uint64_t t0 = 1'000'000'000;
  for (uint64_t s = 0; s < 300; ++s) {
    const uint64_t t = t0 + s * kStepNs;
    add_step_calls(live, t);
    add_busy_step(live, t, 6'000'000);
    // The 19 Hz sampler's view, about: one sample in the kernel every fifth step.
    if (s % 5 == 0) live.add_kernel_sample(t + 1'000'000, kPid, kPid, s % 20 ? "page faults" : "mmap");
    if (s % 5 == 1) live.add_kernel_sample(t + 1'000'000, kPid, kPid + 1, "read");  // another thread's
  }
  feed_gpu(live, t0, 3, 30);
  live.tick(t0 + 3'000'000'000);
  const auto c = live.current();
  ASSERT_EQ(c.size(), 1u);
  ASSERT_FALSE(c[0].findings.empty());
  EXPECT_EQ(c[0].findings[0].cause, "host_kernel");
  EXPECT_NE(c[0].findings[0].evidence.find("its CPU samples there: 75% in page faults, 25% in mmap system calls"),
            std::string::npos)
      << c[0].findings[0].evidence;
}

// `n` steps of `step_ns` from `from_ns`, its main thread asleep `sleep_ns` of each.
uint64_t feed_steps(agent::LiveDiagnosis& live, uint64_t from_ns, int n, uint64_t step_ns, uint64_t sleep_ns) {
  uint64_t t = from_ns;
  for (int s = 0; s < n; ++s, t += step_ns) {
    add_step_calls(live, t);
    store::ThreadTimeRow r;
    r.pid = r.tid = kPid;
    r.start_ns = t;
    r.end_ns = t + step_ns;
    r.on_cpu_ns = step_ns - sleep_ns;
    r.sleep_ns = sleep_ns;
    r.state = "on_cpu";
    live.add_thread_time(r);
  }
  return t;
}

TEST(LiveDiagnosis, AProcesssStartUpIsNotDiagnosed) {
  // Its first steps are slow and sleep most of their time (a start-up's), then it runs clean: the
  // first analysis leaves them out and finds nothing in the rest, at once.
  agent::LiveDiagnosis live({});
  const uint64_t t0 = 1'000'000'000;
  uint64_t t = feed_steps(live, t0, 10, 4 * kStepNs, 3 * kStepNs);
  t = feed_steps(live, t, 100, kStepNs, 0);
  live.tick(t);
  auto cur = live.current();
  ASSERT_EQ(cur.size(), 1u);
  EXPECT_TRUE(cur[0].findings.empty()) << cur[0].findings[0].cause;
  EXPECT_LE(cur[0].steps, 100u);
  // Nor later, while those steps are still in the window.
  t = feed_steps(live, t, 50, kStepNs, 0);
  live.tick(t);
  cur = live.current();
  ASSERT_EQ(cur.size(), 1u);
  EXPECT_TRUE(cur[0].findings.empty()) << cur[0].findings[0].cause;
}

TEST(LiveDiagnosis, ACauseThereFromTheFirstStepsIsToldAtTheFirstAnalysis) {
  // A loop that sleeps a third of every step from its first: nothing to leave out, named at once.
  agent::LiveDiagnosis live({});
  const uint64_t t = feed_steps(live, 1'000'000'000, 60, 3 * kStepNs, kStepNs);
  live.tick(t);
  EXPECT_EQ(causes(live), std::vector<std::string>{"sleep"});
}

TEST(LiveDiagnosis, TheGpusReadingsOfAStartUpAreLeftOutWithIt) {
  // A GPU 99% busy in the steady steps, read 20% busy just after the slow first steps (NVML's
  // reading covers the time before it): the host's sleep is bounded by the steady readings alone.
  agent::LiveDiagnosis live({});
  const uint64_t t0 = 1'000'000'000;
  uint64_t t = feed_steps(live, t0, 10, 4 * kStepNs, 3 * kStepNs);
  const uint64_t steady = t;
  feed_gpu(live, steady, 0.95, 20);
  t = feed_steps(live, t, 200, kStepNs, kStepNs / 5);
  feed_gpu(live, steady + 1'000'000'000, 1.0, 99);
  live.tick(t);
  const auto cur = live.current();
  ASSERT_EQ(cur.size(), 1u);
  EXPECT_TRUE(cur[0].findings.empty()) << cur[0].findings[0].cause;
}

TEST(LiveDiagnosis, AHostCauseWaitsForAReadingOfTheSettledSteps) {
  // The GPU read during the start-up only: the sleep is not told until a reading bounds it.
  agent::LiveDiagnosis live({});
  uint64_t t = feed_steps(live, 1'000'000'000, 10, 4 * kStepNs, 3 * kStepNs);
  feed_gpu(live, t - 300'000'000, 0.3, 10);
  t = feed_steps(live, t, 50, kStepNs, kStepNs / 2);
  live.tick(t);
  EXPECT_TRUE(causes(live).empty());
  t = feed_steps(live, t, 100, kStepNs, kStepNs / 2);
  feed_gpu(live, t - 300'000'000, 0.3, 10);
  live.tick(t);
  EXPECT_EQ(causes(live), std::vector<std::string>{"sleep"});
}

TEST(LiveDiagnosis, StepsStillGettingFasterAreAStartUpUntilTheySettle) {
  using agent::LiveDiagnosis;
  std::vector<double> ms;
  std::vector<uint64_t> at;
  auto steps = [&](std::vector<double> v) {
    for (double m : v) {
      at.push_back(ms.empty() ? 0 : at.back() + uint64_t(ms.back() * 1e6));
      ms.push_back(m);
    }
  };
  // 400, 360, ... 40 ms: each a little faster than the one before.
  steps({400, 360, 320, 280, 240, 200, 160, 120, 80, 40});
  EXPECT_FALSE(LiveDiagnosis::settled_from(ms, at));
  // Then 20 steps of 40 ms: the start-up ends at the first of the fast ones.
  steps(std::vector<double>(20, 40));
  EXPECT_EQ(LiveDiagnosis::settled_from(ms, at), std::optional<uint64_t>(at[9]));
  // Slow steps after fast ones are a fault, not a start-up: nothing is left out.
  ms.clear();
  at.clear();
  steps({500, 500, 500, 500, 500, 1500, 1500, 1500, 1500, 1500, 1500});
  EXPECT_EQ(LiveDiagnosis::settled_from(ms, at), std::optional<uint64_t>(at[0]));
  // Steps of 800 ms: a second of them is enough; one is not.
  ms.clear();
  at.clear();
  steps({800});
  EXPECT_FALSE(LiveDiagnosis::settled_from(ms, at));
  steps({800});
  EXPECT_EQ(LiveDiagnosis::settled_from(ms, at), std::optional<uint64_t>(at[0]));
}
