// What `diagnose` concludes from a record: per process, its steps, where the thread that feeds
// the GPU spent each step (host telemetry and its CUDA calls), and findings ranked by the share of
// step time they explain, each with its evidence and the fix in the user's terms.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cuda/functions.h"
#include "diagnose/steps.h"
#include "host/pressure.h"
#include "store/record_reader.h"

namespace gpuscope::report {
class CallSites;
}

namespace gpuscope::diagnose {

// Stall shares from PSI and quota throttling over a stretch of time (0..1); -1: not read.
struct Pressure {
  std::string cgroup;  // "" for the host's
  double cpu_some = -1, memory_some = -1, memory_full = -1, io_some = -1, io_full = -1;
  double throttled = -1, throttled_periods = -1;  // cpu.stat: time throttled, share of quota periods
  double refault_bytes_per_s = -1;  // page-cache pages read back soon after their eviction
  double tcp_retrans_per_s = -1, tcp_retrans_share = -1;  // TCP segments retransmitted: a second, of those sent
};

// A thread window where network softirqs took this share of its CPU time or more: its CPU is
// under a storm of packets (Breakdown::storm_sys). At a tenth, a loopback flood steered onto a
// spinning loop's CPU on the dev VM (softirqs 7-8% of its time, system time 80%: the interrupts
// and exits that bring the packets) was taken for the loop's own kernel work in 2 runs of 3.
constexpr double kSoftirqStorm = 0.05;

// Where the feeding thread's time went in some steps (nanoseconds, summed over them).
struct Breakdown {
  double steps = 0;  // how many
  double window_ns = 0;
  double on_cpu = 0, runnable = 0, io = 0, lock = 0, fd = 0, sleep = 0, other = 0;
  double unseen = 0;        // no host telemetry covers it
  // Blocked until another of its threads that makes CUDA calls woke it: its GPU work carried on
  // there (PyTorch's autograd engine runs the backward pass while the main thread waits). Not in
  // lock or fd.
  double handoff = 0;
  double runnable_idle = 0; // waiting for a CPU that had gone idle: a CPU quota's throttling
  double reclaim = 0;       // in direct reclaim (within the states above)
  double net_softirq = 0;   // of on_cpu: network softirqs the kernel ran on its CPU
  double sys = 0;           // of on_cpu: system time (the kernel's work for its system calls and faults)
  // Of sys and net_softirq: those of its windows where softirqs took a tenth of its CPU time or
  // more. There the interrupt work on its CPU costs it more system time than the softirqs measured
  // (the interrupts that raise them, and on a VM their exits).
  double storm_sys = 0, storm_softirq = 0;
  double in_sync = 0, in_pageable_copy = 0, in_copy = 0, in_launch = 0, in_cuda = 0;  // in CUDA calls
                                                                                        // (in_cuda: all)
  double syncs = 0, pageable_copies = 0;
  // What gpuscope's own probes added to the process's CUDA calls (their traps and programs run in
  // the kernel, in its threads' time): the observer's cost, not the job's.
  double probes = 0;
  double pageable_bytes = 0;
  double launches = 0;
  std::map<int64_t, double> sync_stacks;  // the stacks of its syncs -> time in them
  // The GPU's side. Kernel times (record --gpu-times) when there are, else NVML's readings of the
  // process's GPU taken within these steps (each covers the last ~1/6 s before it).
  double gpu_busy = 0;
  bool gpu_known = false;   // GPU times (record --gpu-times) cover these steps
  double host_late = 0;     // (GPU times) idle because the next kernel was launched after the last ended
  double gpu_util = 0, gpu_util_n = 0;         // NVML: sum of busy shares (0..1), readings
  // GPM (Hopper and later): sum of SM-active shares (0..1) and NVML's busy shares of the same
  // readings, readings. A small kernel keeps the GPU "busy" with most of its SMs idle.
  double sm_active = 0, sm_active_util = 0, sm_active_n = 0;
  double own_sm = 0, other_sm = 0, sm_n = 0;   // NVML per process: sums of SM shares (0..1), readings
  std::map<uint32_t, double> other_sm_by;      // pid -> sum of its SM shares
  std::set<uint32_t> gpu_tenants;              // other processes NVML saw on the GPU
  double pcie_bytes_per_s = 0, pcie_n = 0;     // NVML: sum of PCIe throughput readings (both ways)
  double copy_bytes = 0;                       // what the process itself copied
  double clock_mhz = 0, clock_n = 0, slowed_n = 0;  // SM clock readings while busy; of them, held
                                                    // down by power or heat
  double max_clock_mhz = 0;
  Pressure host_pressure, cgroup_pressure;  // over the steps' span (not summed by add)
  // The share of the steps the GPU was busy: kernel times, else NVML; -1 when neither covers them.
  double busy_share() const;
  std::map<uint32_t, double> waited_for;  // pid -> runnable time spent behind it
  std::map<uint32_t, double> woken_by;    // pid -> blocked time (I/O, lock, fd) it ended, handoffs aside
  // Of woken_by: waits ended by another of its threads that was itself fed by that process (the
  // DataLoader's pin-memory thread passes on what the workers made).
  std::map<uint32_t, double> relayed;
  // Blocked time by what it blocked in ("fsync on /data/ckpt.pt", "recvfrom on tcp a -> b"): the
  // window's longest blocked stretch stands for its I/O, and for its pipe, socket and lock waits.
  std::map<std::string, double> io_in, fd_in;
  // Its CPU samples taken in the kernel, by what it was doing there (kernel_activity.h).
  std::map<std::string, double> kernel_in;
  void add(const Breakdown& o);
};

struct Finding {
  std::string cause;       // cpu_contention, cpu_throttling, memory_pressure, io_wait, input_wait,
                           // lock_wait, sleep, host_kernel, pageable_copies, sync_per_step, launch_bound,
                           // host_compute, small_kernels, softirq, gpu_contention, pcie_contention,
                           // gpu_clocks_throttled, gpu_error,
                           // none
  std::string title;
  double share = 0;        // of step time
  double ms_per_step = 0;
  uint64_t from_ns = 0, to_ns = 0;  // the window it was seen in (from the recording's start)
  std::string evidence;
  std::string fix;
  std::string confidence;  // high, medium, low
};

struct ProcessDiagnosis {
  uint32_t pid = 0, feeding_tid = 0;
  std::string comm, cmdline;
  Steps steps;
  std::vector<double> step_ms;
  std::vector<uint64_t> step_start_ns;  // where each of step_ms began (the evidence's clock)
  double p50_ms = 0, p90_ms = 0;
  size_t slow_steps = 0;   // longer than 1.25x the median
  Breakdown all, slow;
  std::vector<Finding> findings;  // ranked; a single `none` when nothing explains 5% of a step
};

// What the analysis works from, read from a record (diagnose) or kept live by the agent.
struct ThreadWindow {  // a store::ThreadTimeRow of the thread
  uint64_t start_ns = 0, end_ns = 0;
  double on_cpu = 0, runnable = 0, io = 0, lock = 0, fd = 0, sleep = 0, other = 0, reclaim = 0;
  double net_softirq = 0;  // of on_cpu: network softirqs run on its CPU
  double sys = 0;          // of on_cpu: system time (system calls, page faults)
  uint64_t waited_ns = 0;
  uint32_t waited_for_tid = 0, waited_for_pid = 0;
  uint32_t waker_tid = 0, waker_pid = 0;
  std::string state;
  std::string blocked_syscall, blocked_on;  // its longest blocked stretch's call and file or socket
};
struct CudaCall {  // a top-level call
  uint64_t ts_ns = 0, duration_ns = 0;
  uint32_t tid = 0;
  cuda::CallKind kind{};  // the function's kind: launch, memcpy, sync...
  bool pageable = false;  // a copy from or to pageable host memory
  int64_t bytes = 0;
  uint64_t key = 0;      // what was called (function, kernel, copy direction): the steps' pattern
  bool to_device = false;  // a copy from the host to the GPU
  int64_t stack_id = 0;
  bool launch() const { return kind == cuda::CallKind::Launch || kind == cuda::CallKind::GraphLaunch; }
  // Work for the GPU: a launch, a copy or a memset.
  bool gpu_work() const { return launch() || kind == cuda::CallKind::Memcpy || kind == cuda::CallKind::Memset; }
};
struct GpuReading {  // NVML, the process's GPU; -1: not read
  uint64_t ts_ns = 0;
  double util = -1;            // share of the last period a kernel ran (0..1)
  double sm_clock_mhz = -1;
  double sm_active = -1;       // GPM: share of the SMs that had work since the last reading (0..1)
  uint64_t throttle_reasons = 0;
  double pcie_bytes_per_s = -1;  // both ways
};
struct GpuProcessReading {  // NVML, per process on the process's GPU
  uint64_t ts_ns = 0;
  uint32_t pid = 0;
  double sm = -1;  // share of the SMs' time (0..1); -1: not read (a process seen by its memory alone)
};
struct KernelSample {  // a CPU sample that found one of its threads in the kernel
  uint64_t ts_ns = 0;
  uint32_t tid = 0;
  std::string what;  // kernel_activity(): a system call's name, "page faults", "interrupts"
};
struct XidEvent {  // the driver's error report about the process's GPU
  uint64_t ts_ns = 0;
  uint32_t xid = 0;
};
struct KernelTime {
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t launched_ns = 0;  // when its launch call was made; 0 unknown
};
struct ProcessEvidence {
  uint32_t pid = 0;
  std::string comm, cmdline;
  std::vector<CudaCall> calls;                            // in time order
  std::map<uint32_t, std::vector<ThreadWindow>> windows;  // by tid, in time order
  std::vector<KernelTime> kernels;                        // GPU times, in time order
  std::vector<GpuReading> gpu;                            // in time order
  std::vector<GpuProcessReading> gpu_processes;           // in time order
  std::vector<XidEvent> xids;                             // in time order
  std::vector<KernelSample> kernel_samples;               // in time order
  std::vector<host::PressureReading> host_pressure, cgroup_pressure;  // in time order
  uint64_t until_ns = 0;  // its exit, or the end of what was seen
  // Spans in which its launches, copies and memsets were not observed (the agent's overhead budget
  // had their probes off), in time order: a step that overlaps one is not a step seen whole.
  std::vector<std::pair<uint64_t, uint64_t>> unobserved;
  // What the probes add to each of its CUDA calls, its driver calls within included (0: unknown).
  double probe_ns_per_call = 0;
  // The Python line (or native caller) of a call's stack, for the evidence; "" when unknown.
  std::function<std::string(int64_t stack_id)> site;
};
// Names of processes (comm) and their parents, for the evidence.
struct ProcessNames {
  std::map<uint32_t, std::string> comm;
  std::map<uint32_t, uint32_t> ppid;
  // Kernel threads seen holding a CPU (kworker, kswapd...): the kernel's own work, which no
  // renice or taskset of theirs moves.
  std::set<uint32_t> kernel_threads;
  std::string of(uint32_t pid) const;
  // gpuscope's own process (the agent, the recorder): a CPU it held is its overhead, not another
  // tenant's contention.
  uint32_t observer = 0;
};

// How the causes of the slow steps alone rank against the rest: by the time they explain over all
// the steps (a record: the question is what slowed the job), or by their share of the slow steps
// (the agent's recent window: what slows it now, before the slow steps fill the window).
enum class SlowSteps { RankedOverAll, RankedAmongThemselves };

// One process's diagnosis; `origin_ns`: instants are given from it. Its step count is 0 when the
// evidence holds no CUDA call.
ProcessDiagnosis analyze(const ProcessEvidence& e, const ProcessNames& names, bool host_telemetry,
                         uint64_t origin_ns, SlowSteps slow_ranking = SlowSteps::RankedOverAll);

struct Diagnosis {
  bool host_telemetry = false;
  bool gpu_times = false;
  uint64_t origin_ns = 0;
  std::vector<ProcessDiagnosis> processes;  // those that launched kernels or copied, busiest first
  std::vector<std::string> notes;           // what the record could not tell (no host telemetry...)
};

struct DiagnoseOptions {
  // Only the calls in [from_ns, to_ns) (from the recording's start; 0: its start, its end): the
  // steps of a stretch of the run.
  uint64_t from_ns = 0, to_ns = 0;
  SlowSteps slow_ranking = SlowSteps::RankedOverAll;
  // Launches, copies and memsets seen only `duty` of each `cycle_ns` (from the window's start), as
  // the agent's overhead budget observes them: what its live diagnosis would have had.
  double duty = 1;
  uint64_t cycle_ns = 2'000'000'000;
};

// `sites` names the Python lines of the calls the evidence cites (none: they go unnamed).
Diagnosis diagnose(store::RecordReader& rec, report::CallSites* sites = nullptr, const DiagnoseOptions& opts = {});

}  // namespace gpuscope::diagnose
