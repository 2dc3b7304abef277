#include "diagnose/analysis.h"

#include <fmt/format.h>

#include "report/call_sites.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>


namespace gpuscope::diagnose {
namespace {

constexpr double kMinShare = 0.05;        // a finding explains at least this share of a step
constexpr double kSlowStep = 1.25;        // a step this much longer than the median is slow
constexpr uint64_t kFallbackWindowNs = 1'000'000'000;

void add_map(std::map<uint32_t, double>& to, const std::map<uint32_t, double>& from) {
  for (const auto& [k, v] : from) to[k] += v;
}

// A stretch of the feeding thread's time: one of its windows, or the time between two, in the
// state the first ended in. Its states' nanoseconds are spread evenly over it when a step covers
// part of it.
struct Segment {
  ThreadWindow w;
  // Its waits for a CPU that had gone idle (throttling): all its runnable time when its longest
  // wait's culprit was the idle task (tid 0), which stands for the window's waits.
  double runnable_idle = 0;
};

double overlap(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) {
  const uint64_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  return hi > lo ? double(hi - lo) : 0;
}

ThreadWindow in_state(uint64_t start, uint64_t end, const std::string& state) {
  ThreadWindow w;
  w.start_ns = start;
  w.end_ns = end;
  const double d = double(end - start);
  (state == "on_cpu" ? w.on_cpu : state == "runnable" ? w.runnable : state == "io" ? w.io
   : state == "lock" ? w.lock : state == "fd" ? w.fd : state == "sleep" ? w.sleep : w.other) = d;
  return w;
}

std::vector<Segment> thread_segments(const std::vector<ThreadWindow>& windows, uint64_t until_ns) {
  std::vector<Segment> out;
  std::string state;
  for (const auto& w : windows) {
    if (!out.empty() && w.start_ns > out.back().w.end_ns && state != "exited")
      out.push_back({in_state(out.back().w.end_ns, w.start_ns, state)});
    out.push_back({w, w.waited_ns > 0 && w.waited_for_tid == 0 ? w.runnable : 0});
    state = w.state;
  }
  if (!out.empty() && state != "exited" && until_ns > out.back().w.end_ns)
    out.push_back({in_state(out.back().w.end_ns, until_ns, state)});
  return out;
}

std::string pct(double share) { return fmt::format("{:.0f}%", share * 100); }

// "; 80% of it in fsync (on /data/ckpt.pt)" when one call accounts for most of `by` (keys "call"
// or "call on what"): the call, and what it was most often on where that was still known (a
// descriptor closed before it could be named leaves only the call).
std::string most_in(const std::map<std::string, double>& by) {
  if (by.empty()) return "";
  double total = 0;
  std::map<std::string, double> calls;
  for (const auto& [k, v] : by) {
    total += v;
    calls[k.substr(0, k.find(" on "))] += v;
  }
  const auto [call, ns] = *std::max_element(calls.begin(), calls.end(),
                                            [](const auto& a, const auto& b) { return a.second < b.second; });
  if (total <= 0 || ns < 0.3 * total) return "";
  std::pair<std::string, double> on{"", 0};
  for (const auto& [k, v] : by)
    if (k.starts_with(call + " on ") && v > on.second) on = {k.substr(call.size() + 4), v};
  return fmt::format("; {} of it in {}{}", pct(ns / total), call, on.first.empty() ? "" : " (on " + on.first + ")");
}
std::string ms(double ns) { return fmt::format("{:.1f} ms", ns / 1e6); }

// The pid that accounts for most of `by`, with its share of the total.
std::pair<uint32_t, double> top(const std::map<uint32_t, double>& by) {
  std::pair<uint32_t, double> best{0, 0};
  double total = 0;
  for (const auto& [pid, v] : by) {
    total += v;
    if (v > best.second) best = {pid, v};
  }
  return {best.first, total > 0 ? best.second / total : 0};
}

// PSI and cpu.stat between t0 and t1, from the readings nearest them (at least 1 s apart).
Pressure pressure_between(const std::vector<host::PressureReading>& r, uint64_t t0, uint64_t t1) {
  Pressure p;
  if (r.size() < 2) return p;
  size_t a = 0;
  while (a + 1 < r.size() && r[a + 1].ts_ns <= t0) ++a;
  size_t b = r.size() - 1;
  while (b > a + 1 && r[b - 1].ts_ns >= t1) --b;
  if (b <= a || r[b].ts_ns < r[a].ts_ns + 1'000'000'000) {
    // A short stretch: widen to a second around it where the readings allow.
    while (b + 1 < r.size() && r[b].ts_ns < r[a].ts_ns + 1'000'000'000) ++b;
    while (a > 0 && r[b].ts_ns < r[a].ts_ns + 1'000'000'000) --a;
  }
  if (b <= a || r[b].ts_ns <= r[a].ts_ns) return p;
  const double dt_us = double(r[b].ts_ns - r[a].ts_ns) / 1e3;
  auto share = [&](const std::optional<uint64_t> host::PressureReading::*f) {
    const auto& x = r[a].*f;
    const auto& y = r[b].*f;
    return x && y && *y >= *x ? std::min(1.0, double(*y - *x) / dt_us) : -1.0;
  };
  p.cgroup = r[b].cgroup;
  p.cpu_some = share(&host::PressureReading::cpu_some_us);
  p.memory_some = share(&host::PressureReading::memory_some_us);
  p.memory_full = share(&host::PressureReading::memory_full_us);
  p.io_some = share(&host::PressureReading::io_some_us);
  p.io_full = share(&host::PressureReading::io_full_us);
  p.throttled = share(&host::PressureReading::throttled_us);
  if (r[a].periods && r[b].periods && r[a].throttled_periods && r[b].throttled_periods &&
      *r[b].periods > *r[a].periods)
    p.throttled_periods = double(*r[b].throttled_periods - *r[a].throttled_periods) / double(*r[b].periods - *r[a].periods);
  return p;
}

}  // namespace

void Breakdown::add(const Breakdown& o) {
  steps += o.steps;
  window_ns += o.window_ns;
  on_cpu += o.on_cpu;
  runnable += o.runnable;
  io += o.io;
  lock += o.lock;
  fd += o.fd;
  sleep += o.sleep;
  other += o.other;
  unseen += o.unseen;
  handoff += o.handoff;
  runnable_idle += o.runnable_idle;
  reclaim += o.reclaim;
  net_softirq += o.net_softirq;
  in_sync += o.in_sync;
  in_pageable_copy += o.in_pageable_copy;
  in_copy += o.in_copy;
  in_cuda += o.in_cuda;
  syncs += o.syncs;
  pageable_copies += o.pageable_copies;
  pageable_bytes += o.pageable_bytes;
  in_launch += o.in_launch;
  launches += o.launches;
  for (const auto& [k, v] : o.sync_stacks) sync_stacks[k] += v;
  gpu_busy += o.gpu_busy;
  gpu_known = gpu_known || o.gpu_known;
  host_late += o.host_late;
  gpu_util += o.gpu_util;
  gpu_util_n += o.gpu_util_n;
  own_sm += o.own_sm;
  other_sm += o.other_sm;
  sm_n += o.sm_n;
  add_map(other_sm_by, o.other_sm_by);
  gpu_tenants.insert(o.gpu_tenants.begin(), o.gpu_tenants.end());
  pcie_bytes_per_s += o.pcie_bytes_per_s;
  pcie_n += o.pcie_n;
  copy_bytes += o.copy_bytes;
  clock_mhz += o.clock_mhz;
  clock_n += o.clock_n;
  slowed_n += o.slowed_n;
  max_clock_mhz = std::max(max_clock_mhz, o.max_clock_mhz);
  add_map(waited_for, o.waited_for);
  add_map(woken_by, o.woken_by);
  add_map(relayed, o.relayed);
  for (const auto& [k, v] : o.io_in) io_in[k] += v;
  for (const auto& [k, v] : o.fd_in) fd_in[k] += v;
}

double Breakdown::busy_share() const {
  if (window_ns <= 0) return -1;
  if (gpu_known) return std::min(1.0, gpu_busy / window_ns);
  if (gpu_util_n > 0) return gpu_util / gpu_util_n;
  return -1;
}

namespace {


// Kernel threads that end waits for disk I/O (writeback, the journal): a wait they end is I/O,
// whatever the thread slept in.
bool io_kernel_thread(const std::string& comm) {
  return comm.starts_with("kworker/") || comm.starts_with("jbd2/") || comm.starts_with("kblockd") ||
         comm.starts_with("xfs") || comm.starts_with("btrfs");
}

// Host time per launch below which a thread that is busy all the step is limited by launching
// (PyTorch's eager ops cost ~10-40 µs each on the host); above it, by work of its own.
constexpr double kLaunchBoundNsPerLaunch = 150'000;
// What a launch costs on the host at most before the call is waiting (a full launch queue).
constexpr double kLaunchNs = 50'000;
// NVML throttle reasons that mean the GPU was slowed against its will: hardware slowdown, thermal
// (software and hardware) and the power brake. The software power cap is left out: busy GPUs sit
// at it as a matter of course.
constexpr uint64_t kSlowdownReasons = 0x8 | 0x20 | 0x40 | 0x80;

void findings_from(Breakdown b, const ProcessNames& names, const ProcessEvidence& e, uint64_t from, uint64_t to,
                   bool telemetry, std::vector<Finding>& out, const std::set<std::string>& have) {
  if (b.window_ns <= 0 || b.steps <= 0) return;
  const uint32_t pid = e.pid;
  for (auto it = b.woken_by.begin(); it != b.woken_by.end();) {
    const auto c = names.comm.find(it->first);
    if (it->first && c != names.comm.end() && io_kernel_thread(c->second)) {
      // Its share of the lock and pipe waits it ended moves to I/O.
      const double moved = std::min(it->second, b.lock + b.fd);
      const double from_lock = b.lock + b.fd > 0 ? moved * b.lock / (b.lock + b.fd) : 0;
      b.lock -= from_lock;
      b.fd -= moved - from_lock;
      b.io += moved;
      it = b.woken_by.erase(it);
    } else {
      ++it;
    }
  }
  // What the GPU did. A cause on the host costs step time only while the GPU has nothing to do:
  // where the GPU's side is known, a host cause explains at most the share the GPU was idle.
  const double busy = b.busy_share();
  const bool gpu_view = busy >= 0;
  const double idle = gpu_view ? 1 - busy : 1;
  const double steps_ms = b.window_ns / b.steps / 1e6;
  auto add_share = [&](std::string cause, std::string title, double share, std::string evidence, std::string fix,
                       std::string confidence) {
    if (share < kMinShare || have.contains(cause)) return;
    for (const auto& f : out)
      if (f.cause == cause) return;
    out.push_back({std::move(cause), std::move(title), share, share * steps_ms, from, to, std::move(evidence),
                   std::move(fix), std::move(confidence)});
  };
  auto add = [&](std::string cause, std::string title, double ns, std::string evidence, std::string fix,
                 std::string confidence) {
    add_share(std::move(cause), std::move(title), std::min(ns / b.window_ns, idle), std::move(evidence),
              std::move(fix), std::move(confidence));
  };
  const std::string gpu_idle_note =
      gpu_view ? fmt::format("; the GPU was idle {} of the steps", pct(idle)) : std::string();

  // Other tenants of the GPU (NVML's per-process readings).
  if (b.sm_n > 0) {
    const double other = b.other_sm / b.sm_n, own = b.own_sm / b.sm_n;
    const auto [tenant, of] = top(b.other_sm_by);
    add_share("gpu_contention", "Another process computes on the same GPU", other,
              fmt::format("{} ran kernels on this GPU {} of the time (this process {}); the GPU time-slices "
                          "between them",
                          tenant ? names.of(tenant) : "another process", pct(other), pct(own)),
              "Give the job a GPU of its own (or a MIG partition); find the other tenant with nvidia-smi "
              "--query-compute-apps=pid,name --format=csv",
              other >= 0.25 ? "high" : "medium");
  }
  if (b.pcie_n > 0 && !b.gpu_tenants.empty()) {
    const double total = b.pcie_bytes_per_s / b.pcie_n;
    const double own = b.copy_bytes / (b.window_ns / 1e9);
    const double external = total - own;
    if (external >= 2e9 && external >= 2 * own) {
      std::string who;
      for (uint32_t t : b.gpu_tenants) who += (who.empty() ? "" : ", ") + names.of(t);
      add_share("pcie_contention", "Another process's copies load this GPU's PCIe link",
                gpu_view ? std::min(idle, external / (external + own)) : 0,
                fmt::format("PCIe carried {:.1f} GB/s while this process copied {:.2f} GB/s; also on the GPU: {}{}",
                            total / 1e9, own / 1e9, who, gpu_idle_note),
                "Move the other tenant's transfers off this GPU (or schedule it elsewhere); keep the job's inputs "
                "on the GPU or copy them in fewer, larger transfers",
                "medium");
    }
  }
  if (b.clock_n >= 3 && b.max_clock_mhz > 0) {
    const double mean = b.clock_mhz / b.clock_n, slowed = b.slowed_n / b.clock_n;
    const double lost = 1 - mean / b.max_clock_mhz;
    if (slowed >= 0.3 && lost >= 0.05)
      add_share("gpu_clocks_throttled", "The GPU's clocks are held down by heat or power",
                lost * std::max(busy, 0.0),
                fmt::format("SM clock {:.0f} MHz on average while busy, {} below the {:.0f} MHz it reached; NVML "
                            "reported a thermal, hardware or power-brake slowdown in {} of the readings",
                            mean, pct(lost), b.max_clock_mhz, pct(slowed)),
                "Check the GPU's cooling and power delivery (nvidia-smi -q -d PERFORMANCE,TEMPERATURE); every "
                "kernel runs slower until it is fixed",
                "high");
  }

  if (telemetry) {
    // Packets processed on its CPU: in its time (softirqs run on whatever task is there) and, when
    // they are many, by ksoftirqd, which it then waits behind.
    double behind_ksoftirqd = 0;
    for (auto it = b.waited_for.begin(); it != b.waited_for.end();) {
      const auto c = names.comm.find(it->first);
      if (it->first && c != names.comm.end() && c->second.starts_with("ksoftirqd/")) {
        behind_ksoftirqd += it->second;
        it = b.waited_for.erase(it);
      } else {
        ++it;
      }
    }
    add("softirq", "Network packet processing (softirqs) takes the CPU of the thread that feeds the GPU",
        b.net_softirq + behind_ksoftirqd,
        fmt::format("the kernel processed network packets on its CPU {} a step while it ran there, and it waited {} a "
                    "step behind ksoftirqd ({} of the step together){}",
                    ms(b.net_softirq / b.steps), ms(behind_ksoftirqd / b.steps),
                    pct((b.net_softirq + behind_ksoftirqd) / b.window_ns), gpu_idle_note),
        "Keep network interrupts and packet steering off the job's CPUs (IRQ affinity, the RPS/XPS masks in "
        "/sys/class/net/*/queues, irqbalance's banned CPUs), or give the job CPUs apart from them",
        "high");
    const double contended = b.runnable - b.runnable_idle - behind_ksoftirqd;
    if (contended > 0) {
      std::map<uint32_t, double> others = b.waited_for;
      others.erase(0);
      others.erase(pid);  // its own threads: too many threads for the cores it has
      const auto [culprit, of] = top(others);
      const std::string who = culprit ? names.of(culprit) : "its own threads";
      add("cpu_contention", "The thread that feeds the GPU waits for a CPU", contended,
          fmt::format("runnable but not running {} a step ({} of the step); the CPU was held mostly by {} ({} of "
                      "that wait){}{}",
                      ms(contended / b.steps), pct(contended / b.window_ns), who, pct(of),
                      b.host_pressure.cpu_some >= 0
                          ? fmt::format("; PSI: the host's tasks waited for a CPU {} of the time",
                                        pct(b.host_pressure.cpu_some))
                          : "",
                      gpu_idle_note),
          culprit ? fmt::format("Give the job CPUs of its own (taskset or a cpuset; Kubernetes' static CPU manager "
                                "policy), or move or renice {}", who)
                  : "Use fewer threads than the cores the job has (torch.set_num_threads, OMP_NUM_THREADS)",
          of >= 0.5 ? "high" : "medium");
    }
    const auto& cg = b.cgroup_pressure;
    const std::string throttled =
        cg.throttled_periods >= 0
            ? fmt::format("; cpu.stat: its cgroup ({}) was throttled in {} of its quota periods, {:.0f} ms a second",
                          cg.cgroup, pct(cg.throttled_periods), std::max(cg.throttled, 0.0) * 1e3)
            : "";
    add("cpu_throttling", "The job's CPU quota throttles the thread that feeds the GPU", b.runnable_idle,
        fmt::format("runnable {} a step while its CPU had gone idle: the scheduler held it back (cgroup cpu.max){}{}",
                    ms(b.runnable_idle / b.steps), throttled, gpu_idle_note),
        "Raise the job's CPU limit (cpu.max; a Kubernetes CPU limit), or remove it", "high");
    // Reclaiming memory itself, the thread also waits for the pages evicted to be read back: the
    // I/O is the memory's doing.
    // PSI says whether the job's tasks stalled on memory (all of them at once: `full`).
    const Pressure& mem_psi = cg.memory_full >= 0 ? cg : b.host_pressure;
    const bool memory = b.reclaim / b.window_ns >= kMinShare || mem_psi.memory_full >= kMinShare;
    const std::string psi =
        mem_psi.memory_some >= 0
            ? fmt::format("; PSI: {} stalled on memory {} of the time (all its tasks at once: {})",
                          mem_psi.cgroup.empty() ? "the host's tasks" : "its cgroup's (" + mem_psi.cgroup + ") tasks",
                          pct(mem_psi.memory_some), pct(std::max(mem_psi.memory_full, 0.0)))
            : "";
    add("memory_pressure", "The thread that feeds the GPU is short of memory", b.reclaim + (memory ? b.io : 0),
        fmt::format("reclaiming memory itself (direct reclaim) {} a step and waiting for I/O {} a step ({} of the "
                    "step together): its cgroup is at its memory limit or the host is short of memory, and pages "
                    "it needs are evicted and read back{}",
                    ms(b.reclaim / b.steps), ms(b.io / b.steps), pct((b.reclaim + b.io) / b.window_ns), psi),
        "Raise the job's memory limit (memory.high/max; a Kubernetes memory limit), or use less host memory: "
        "fewer DataLoader workers or a smaller prefetch_factor, memory-mapped datasets instead of copies",
        "high");
    if (memory) b.io = 0;
    add("io_wait", "The thread that feeds the GPU waits for disk I/O", b.io,
        fmt::format("blocked in uninterruptible I/O {} a step ({} of the step){}{}{}",
                    ms(b.io / b.steps), pct(b.io / b.window_ns),
                    b.io_in.empty() || most_in(b.io_in).empty()
                        ? ", e.g. writing and fsyncing a checkpoint, or reading data from disk"
                        : most_in(b.io_in),
                    b.host_pressure.io_some >= 0
                        ? fmt::format("; PSI: the host's tasks stalled on I/O {} of the time", pct(b.host_pressure.io_some))
                        : "",
                    gpu_idle_note),
        "Write checkpoints asynchronously (a background thread or process; "
        "torch.distributed.checkpoint.async_save) and read data ahead (DataLoader workers, prefetching)",
        "high");
    // Waits for another process (a DataLoader worker feeds it through a pipe or shared memory and
    // a lock) and for its own threads are told apart by who ended them.
    std::map<uint32_t, double> outside = b.woken_by;
    outside.erase(pid);
    outside.erase(0);
    const auto [feeder, feeder_of] = top(outside);
    const bool from_child = feeder && names.ppid.contains(feeder) && names.ppid.at(feeder) == pid;
    const bool relayed = feeder && b.relayed.contains(feeder) && b.relayed.at(feeder) * 2 >= outside.at(feeder);
    const double waits = b.fd + b.lock;
    if (feeder && feeder_of >= 0.5) {
      add("input_wait", "The thread that feeds the GPU waits for its input", waits,
          fmt::format("blocked on a pipe, socket or lock {} a step ({} of the step), woken mostly by {}{}{}{}{}",
                      ms(waits / b.steps), pct(waits / b.window_ns), names.of(feeder),
                      from_child ? ", a child of the job (a data loader worker)" : "",
                      relayed ? ", through another of its threads (the DataLoader's pin-memory thread)" : "",
                      most_in(b.fd_in), gpu_idle_note),
          from_child ? "Give the DataLoader more workers (num_workers), make __getitem__ cheaper, or prefetch more "
                       "(prefetch_factor)"
                     : fmt::format("Make {} deliver faster, or read ahead of the step", names.of(feeder)),
          from_child ? "high" : "medium");
    } else {
      add("lock_wait", "The thread that feeds the GPU waits on a lock held by another of its threads", b.lock,
          fmt::format("blocked in futex {} a step ({} of the step), woken by its own threads (in Python, often "
                      "the GIL held by preprocessing threads){}",
                      ms(b.lock / b.steps), pct(b.lock / b.window_ns), gpu_idle_note),
          "Move preprocessing out of the training process (DataLoader worker processes), or release the GIL in it",
          "medium");
      add("input_wait", "The thread that feeds the GPU waits on a pipe or socket", b.fd,
          fmt::format("blocked reading or polling {} a step ({} of the step){}{}", ms(b.fd / b.steps),
                      pct(b.fd / b.window_ns), most_in(b.fd_in), gpu_idle_note),
          "Read the input ahead of the step (more workers, prefetching, a local copy of remote data)", "medium");
    }
    add("sleep", "The thread that feeds the GPU sleeps", b.sleep,
        fmt::format("in nanosleep {} a step ({} of the step){}", ms(b.sleep / b.steps), pct(b.sleep / b.window_ns),
                    gpu_idle_note),
        "Remove the sleep (or the polling loop that sleeps) from the training loop", "high");
  }
  add("pageable_copies", "Copies between the GPU and pageable host memory", b.in_pageable_copy,
      fmt::format("{:.1f} copies a step from or to pageable memory ({:.1f} MB a step) took {} a step ({} of the "
                  "step); pageable copies are staged through a pinned buffer by the driver and cannot overlap",
                  b.pageable_copies / b.steps, b.pageable_bytes / b.steps / 1e6, ms(b.in_pageable_copy / b.steps),
                  pct(b.in_pageable_copy / b.window_ns)),
      "Pin the host memory: pin_memory=True on the DataLoader, tensor.pin_memory(), or cudaMallocHost; then "
      "copy with non_blocking=True",
      "high");

  // The GPU idle while the thread that feeds it was running its own code: what it ran tells why.
  // Needs the GPU's side and the thread's on-CPU time.
  if (!gpu_view || !telemetry) return;
  const double blocked = b.runnable + b.io + b.lock + b.fd + b.sleep + b.reclaim + b.net_softirq;
  // Its own work: on a CPU outside CUDA calls, plus what launching costs (a launch that waits for
  // a full queue is the GPU's doing, not the host's).
  const double own_work =
      std::max(0.0, b.on_cpu - b.net_softirq - b.in_cuda) + std::min(b.in_launch, b.launches * kLaunchNs);
  const double residual = std::min({std::max(0.0, idle - blocked / b.window_ns - b.in_pageable_copy / b.window_ns),
                                    own_work / b.window_ns, b.gpu_known ? b.host_late / b.window_ns : 1.0});
  if (b.syncs >= b.steps && b.in_sync / b.window_ns >= kMinShare) {
    std::pair<int64_t, double> where{0, 0};
    for (const auto& [stack, ns] : b.sync_stacks)
      if (ns > where.second) where = {stack, ns};
    const std::string site = where.first && e.site ? e.site(where.first) : "";
    add_share("sync_per_step", "The host waits for the GPU every step, then the GPU waits for the host", residual,
              fmt::format("{:.1f} syncs a step, waiting {} a step{}; after each the GPU idles while the thread "
                          "prepares and launches the next work ({} of the step idle)",
                          b.syncs / b.steps, ms(b.in_sync / b.steps), site.empty() ? "" : ", most at " + site,
                          pct(idle)),
              fmt::format("Remove the synchronisation from the step{}: keep values on the GPU (accumulate a loss "
                          "tensor and call .item() every N steps), avoid .cpu()/.numpy()/print of CUDA tensors and "
                          "torch.cuda.synchronize() in the loop",
                          site.empty() ? "" : " (" + site + ")"),
              "high");
    return;
  }
  if (b.launches <= 0 || own_work / b.window_ns < 0.5) return;
  const double per_launch = own_work / b.launches;
  if (per_launch <= kLaunchBoundNsPerLaunch)
    add_share("launch_bound", "The GPU waits for kernels to be launched: they are shorter than their launch",
              residual,
              fmt::format("{:.0f} launches a step at {:.0f} µs of host time each; the thread that feeds the GPU ran "
                          "{} of the step while the GPU was idle {}",
                          b.launches / b.steps, per_launch / 1e3, pct(own_work / b.window_ns), pct(idle)),
              "Give each kernel more work: a bigger batch; fewer, fused kernels (torch.compile); or capture the step "
              "in a CUDA graph (torch.compile(mode=\"reduce-overhead\"), torch.cuda.graphs)",
              "high");
  else
    add_share("host_compute", "The thread that feeds the GPU computes on the CPU between launches", residual,
              fmt::format("on a CPU {} of the step, {:.1f} ms between launches on average, while the GPU was idle "
                          "{}",
                          pct(own_work / b.window_ns), per_launch / 1e6, pct(idle)),
              "Move the CPU work out of the loop: preprocessing into DataLoader workers, or onto the GPU; "
              "`record --cpu-profile 99` shows where it goes",
              "medium");
}

}  // namespace

std::string ProcessNames::of(uint32_t pid) const {
  auto it = comm.find(pid);
  return it == comm.end() || it->second.empty() ? fmt::format("pid {}", pid) : fmt::format("{} (pid {})", it->second, pid);
}

ProcessDiagnosis analyze(const ProcessEvidence& e, const ProcessNames& names, bool telemetry, uint64_t origin_ns) {
  ProcessDiagnosis p;
  p.pid = e.pid;
  p.comm = e.comm;
  p.cmdline = e.cmdline;
  const uint32_t pid = e.pid;
  // The thread that feeds the GPU: the main thread when it makes a share of the calls (PyTorch
  // launches the backward pass from its autograd threads, but the loop is the main thread's).
  std::map<uint32_t, size_t> per_thread;
  for (const auto& c : e.calls) ++per_thread[c.tid];
  {
    size_t top_calls = 0;
    uint32_t top_tid = pid;
    for (const auto& [tid, n] : per_thread)
      if (n > top_calls) top_calls = n, top_tid = tid;
    p.feeding_tid = per_thread.contains(pid) && per_thread[pid] * 10 >= e.calls.size() ? pid : top_tid;
  }
  // Its threads that launch GPU work (PyTorch's autograd threads): while they do, the feeding
  // thread's wait for them is the GPU's work carrying on, not a stall. A thread that only pins
  // memory or records events (the DataLoader's pin-memory thread) is not one.
  std::set<uint32_t> launching_threads;
  for (const auto& c : e.calls)
    if (c.kind == "launch" || c.kind == "graph_launch" || c.kind == "memcpy" || c.kind == "memset")
      launching_threads.insert(c.tid);
  // Its other threads that are themselves fed by another process: a wait they end passes on that
  // process's lateness (the pin-memory thread waits for the DataLoader's workers).
  std::map<uint32_t, uint32_t> upstream;  // tid -> pid
  for (const auto& [tid, windows] : e.windows) {
    if (tid == p.feeding_tid) continue;
    std::map<uint32_t, double> by;
    double blocked = 0, all = 0;
    for (const auto& w : windows) {
      const double b = w.io + w.lock + w.fd;
      blocked += b;
      all += double(w.end_ns - w.start_ns);
      if (b > 0) by[w.waker_pid] += b;
    }
    by.erase(pid);
    by.erase(0);
    const auto [feeder, of] = top(by);
    double fed = 0;
    for (const auto& [k, v] : by) fed += v;
    if (feeder && of >= 0.5 && fed >= 0.5 * blocked && blocked >= 0.2 * all) upstream[tid] = feeder;
  }
  // The GPU's other tenants: NVML's processes on it outside this process and its children.
  auto family = [&](uint32_t other) {
    for (int depth = 0; other && depth < 8; ++depth) {
      if (other == pid) return true;
      const auto it = names.ppid.find(other);
      if (it == names.ppid.end()) return false;
      other = it->second;
    }
    return false;
  };
  double max_clock = 0;
  for (const auto& r : e.gpu) max_clock = std::max(max_clock, r.sm_clock_mhz);
  // The process's calls, as the steps' pattern; the feeding thread's, for where its time went.
  std::vector<Token> tokens;
  std::vector<const CudaCall*> calls;
  for (const auto& c : e.calls) {
    if (c.kind == "launch" || c.kind == "graph_launch" || c.kind == "memcpy" || c.kind == "memset" || c.kind == "sync")
      tokens.push_back({c.ts_ns, c.key});
    if (c.tid == p.feeding_tid) calls.push_back(&c);
  }
  if (tokens.empty()) return p;
  p.steps = find_steps(tokens);
  std::vector<uint64_t> starts = p.steps.starts;
  if (p.steps.count() == 0) {
    // No loop found: fixed windows over the span of its calls.
    starts.clear();
    for (uint64_t t = tokens.front().ts_ns; t < tokens.back().ts_ns + kFallbackWindowNs; t += kFallbackWindowNs)
      starts.push_back(t);
  }
  static const std::vector<ThreadWindow> none;
  const auto w = e.windows.find(p.feeding_tid);
  const auto segments = telemetry ? thread_segments(w == e.windows.end() ? none : w->second, e.until_ns)
                                  : std::vector<Segment>{};
  const auto& kernels = e.kernels;

  std::vector<Breakdown> per_step;
  size_t seg = 0, call = 0, any_call = 0, kern = 0, reading = 0, proc_reading = 0;
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    const uint64_t s = starts[i], end = starts[i + 1];
    Breakdown b;
    b.steps = 1;
    b.window_ns = double(end - s);
    while (seg < segments.size() && segments[seg].w.end_ns <= s) ++seg;
    double seen = 0;
    for (size_t j = seg; j < segments.size() && segments[j].w.start_ns < end; ++j) {
      const auto& g = segments[j].w;
      const double runnable_idle = segments[j].runnable_idle;
      const double len = double(g.end_ns - g.start_ns);
      if (len <= 0) continue;
      const double f = overlap(g.start_ns, g.end_ns, s, end) / len;
      seen += overlap(g.start_ns, g.end_ns, s, end);
      b.on_cpu += g.on_cpu * f;
      b.runnable += g.runnable * f;
      b.io += g.io * f;
      const bool handoff =
          g.waker_pid == pid && g.waker_tid != p.feeding_tid && launching_threads.contains(g.waker_tid);
      (handoff ? b.handoff : b.lock) += g.lock * f;
      (handoff ? b.handoff : b.fd) += g.fd * f;
      b.sleep += g.sleep * f;
      b.other += g.other * f;
      b.runnable_idle += runnable_idle * f;
      b.reclaim += g.reclaim * f;
      b.net_softirq += g.net_softirq * f;
      if (g.runnable > 0) b.waited_for[g.waited_for_pid] += (g.runnable - runnable_idle) * f;
      if (!g.blocked_syscall.empty()) {
        const std::string what =
            g.blocked_on.empty() ? g.blocked_syscall : fmt::format("{} on {}", g.blocked_syscall, g.blocked_on);
        if (g.io > 0) b.io_in[what] += g.io * f;
        if (g.fd + g.lock > 0 && !handoff) b.fd_in[what] += (g.fd + g.lock) * f;
      }
      if (g.io + g.lock + g.fd > 0 && !handoff) {
        const auto relay = g.waker_pid == pid ? upstream.find(g.waker_tid) : upstream.end();
        const uint32_t waker = relay == upstream.end() ? g.waker_pid : relay->second;
        b.woken_by[waker] += (g.io + g.lock + g.fd) * f;
        if (relay != upstream.end()) b.relayed[waker] += (g.io + g.lock + g.fd) * f;
      }
    }
    b.unseen = std::max(0.0, b.window_ns - seen);
    while (call < calls.size() && calls[call]->ts_ns < s) ++call;
    for (size_t j = call; j < calls.size() && calls[j]->ts_ns < end; ++j) {
      const auto& c = *calls[j];
      b.in_cuda += double(c.duration_ns);
      if (c.kind == "sync") {
        b.in_sync += double(c.duration_ns);
        ++b.syncs;
        b.sync_stacks[c.stack_id] += double(c.duration_ns);
      } else if (c.kind == "launch" || c.kind == "graph_launch") {
        b.in_launch += double(c.duration_ns);
      } else if (c.kind == "memcpy") {
        b.in_copy += double(c.duration_ns);
        b.copy_bytes += double(std::max<int64_t>(c.bytes, 0));
        if (c.host_mem == "pageable") {
          b.in_pageable_copy += double(c.duration_ns);
          ++b.pageable_copies;
          b.pageable_bytes += double(c.bytes);
        }
      }
    }
    // Launches by any of its threads (the backward pass's come from autograd's).
    while (any_call < e.calls.size() && e.calls[any_call].ts_ns < s) ++any_call;
    for (size_t j = any_call; j < e.calls.size() && e.calls[j].ts_ns < end; ++j)
      if (e.calls[j].kind == "launch" || e.calls[j].kind == "graph_launch") ++b.launches;
    if (!kernels.empty()) {
      b.gpu_known = true;
      while (kern < kernels.size() && kernels[kern].end_ns <= s) ++kern;
      uint64_t covered_to = s;
      for (size_t j = kern; j < kernels.size() && kernels[j].start_ns < end; ++j) {
        const auto& k = kernels[j];
        const uint64_t a = std::max({k.start_ns, covered_to, s}), z = std::min(k.end_ns, end);
        // Idle before it because it was launched after the GPU had run out of work (HTA's "host
        // wait"); the rest of an idle gap is the launch's latency or a wait on other work.
        if (k.launched_ns > covered_to && k.start_ns > covered_to)
          b.host_late += double(std::min({k.launched_ns, k.start_ns, end}) - covered_to);
        if (z > a) b.gpu_busy += double(z - a);
        covered_to = std::max(covered_to, z);
      }
    }
    // NVML's readings of its GPU taken within the step.
    while (reading < e.gpu.size() && e.gpu[reading].ts_ns < s) ++reading;
    for (size_t j = reading; j < e.gpu.size() && e.gpu[j].ts_ns < end; ++j) {
      const auto& r = e.gpu[j];
      if (r.util >= 0) {
        b.gpu_util += r.util;
        ++b.gpu_util_n;
      }
      if (r.pcie_bytes_per_s >= 0) {
        b.pcie_bytes_per_s += r.pcie_bytes_per_s;
        ++b.pcie_n;
      }
      if (r.sm_clock_mhz > 0 && r.util >= 0.5) {
        b.clock_mhz += r.sm_clock_mhz;
        ++b.clock_n;
        b.slowed_n += (r.throttle_reasons & kSlowdownReasons) != 0;
      }
    }
    b.max_clock_mhz = max_clock;
    // Per process: one reading of each at an instant; the instants with a reading of SM use count.
    while (proc_reading < e.gpu_processes.size() && e.gpu_processes[proc_reading].ts_ns < s) ++proc_reading;
    for (size_t j = proc_reading; j < e.gpu_processes.size() && e.gpu_processes[j].ts_ns < end;) {
      const uint64_t at = e.gpu_processes[j].ts_ns;
      bool any_sm = false;
      for (; j < e.gpu_processes.size() && e.gpu_processes[j].ts_ns == at; ++j) {
        const auto& r = e.gpu_processes[j];
        const bool own = family(r.pid);
        if (!own) b.gpu_tenants.insert(r.pid);
        if (r.sm < 0) continue;
        any_sm = true;
        (own ? b.own_sm : b.other_sm) += r.sm;
        if (!own) b.other_sm_by[r.pid] += r.sm;
      }
      b.sm_n += any_sm;
    }
    per_step.push_back(std::move(b));
    p.step_ms.push_back(double(end - s) / 1e6);
  }
  if (per_step.empty()) return p;
  std::vector<double> sorted = p.step_ms;
  std::sort(sorted.begin(), sorted.end());
  p.p50_ms = sorted[sorted.size() / 2];
  p.p90_ms = sorted[std::min(sorted.size() - 1, sorted.size() * 9 / 10)];
  uint64_t slow_from = 0, slow_to = 0;
  for (size_t i = 0; i < per_step.size(); ++i) {
    p.all.add(per_step[i]);
    if (p.step_ms[i] > kSlowStep * p.p50_ms) {
      ++p.slow_steps;
      p.slow.add(per_step[i]);
      if (!slow_from) slow_from = starts[i];
      slow_to = starts[i + 1];
    }
  }
  p.all.host_pressure = pressure_between(e.host_pressure, starts.front(), starts.back());
  p.all.cgroup_pressure = pressure_between(e.cgroup_pressure, starts.front(), starts.back());
  if (p.slow_steps) {
    p.slow.host_pressure = pressure_between(e.host_pressure, slow_from, slow_to);
    p.slow.cgroup_pressure = pressure_between(e.cgroup_pressure, slow_from, slow_to);
  }
  auto since_origin = [&](uint64_t t) { return t - std::min(t, origin_ns); };
  const uint64_t from = since_origin(starts.front()), to = since_origin(starts.back());
  findings_from(p.all, names, e, from, to, telemetry, p.findings, {});
  // Causes of the slow steps alone (a hog that came for a while), in their window.
  if (p.slow_steps >= 2) {
    std::set<std::string> have;
    for (const auto& f : p.findings) have.insert(f.cause);
    findings_from(p.slow, names, e, since_origin(slow_from), since_origin(slow_to), telemetry, p.findings, have);
  }
  std::stable_sort(p.findings.begin(), p.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.share > b.share; });
  if (p.findings.empty()) {
    const double busy = p.all.busy_share();
    p.findings.push_back(
        {"none", "No problem found", 0, 0, from, to,
         busy >= 0 ? fmt::format("no cause explains {} of a step or more; the GPU was busy {} of the steps{}",
                                 pct(kMinShare), pct(busy),
                                 busy >= 0.9 ? ": the job is bound by the GPU's work (faster kernels, mixed "
                                               "precision or a lighter model would speed it up)"
                                             : "")
                   : fmt::format("no cause explains {} of a step or more", pct(kMinShare)),
         "", "medium"});
  }
  return p;
}

namespace {

// The GPU a process used: where NVML saw it or its children; the only GPU sampled when it saw
// none of them.
std::optional<uint32_t> process_gpu(store::Db& db, uint32_t pid, const ProcessNames& names) {
  if (!db.has_table("gpu_samples")) return std::nullopt;
  std::map<uint32_t, size_t> seen;
  {
    auto q = db.prepare("SELECT gpu, pid, count(*) FROM gpu_process_samples GROUP BY gpu, pid");
    while (q.step()) {
      uint32_t other = uint32_t(q.i64(1));
      for (int depth = 0; other && depth < 8; ++depth) {
        if (other == pid) {
          seen[uint32_t(q.i64(0))] += size_t(q.i64(2));
          break;
        }
        const auto it = names.ppid.find(other);
        if (it == names.ppid.end()) break;
        other = it->second;
      }
    }
  }
  if (!seen.empty())
    return std::max_element(seen.begin(), seen.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  auto q = db.prepare("SELECT DISTINCT gpu FROM gpu_samples LIMIT 2");
  std::vector<uint32_t> gpus;
  while (q.step()) gpus.push_back(uint32_t(q.i64(0)));
  if (gpus.size() == 1) return gpus[0];
  return std::nullopt;
}

void read_nvml(store::Db& db, uint32_t gpu, ProcessEvidence& e) {
  auto q = db.prepare(
      "SELECT ts_ns, gpu_util, sm_clock_mhz, throttle_reasons, pcie_tx_kbs, pcie_rx_kbs FROM gpu_samples WHERE "
      "gpu = ?1 ORDER BY ts_ns");
  q.bind(1, int64_t(gpu));
  while (q.step()) {
    GpuReading r;
    r.ts_ns = uint64_t(q.i64(0));
    if (!q.is_null(1)) r.util = double(q.i64(1)) / 100;
    if (!q.is_null(2)) r.sm_clock_mhz = double(q.i64(2));
    if (!q.is_null(3)) r.throttle_reasons = uint64_t(q.i64(3));
    if (!q.is_null(4) && !q.is_null(5)) r.pcie_bytes_per_s = double(q.i64(4) + q.i64(5)) * 1024;
    e.gpu.push_back(r);
  }
  if (!db.has_table("gpu_process_samples")) return;
  auto p = db.prepare("SELECT ts_ns, pid, sm_util FROM gpu_process_samples WHERE gpu = ?1 ORDER BY ts_ns, pid");
  p.bind(1, int64_t(gpu));
  while (p.step())
    e.gpu_processes.push_back({uint64_t(p.i64(0)), uint32_t(p.i64(1)), p.is_null(2) ? -1 : double(p.i64(2)) / 100});
}

}  // namespace

Diagnosis diagnose(store::RecordReader& rec, report::CallSites* sites) {
  Diagnosis d;
  store::Db& db = rec.db();
  d.origin_ns = uint64_t(rec.meta_i64("start_ns", 0));
  const bool telemetry_table = db.has_table("thread_times");
  d.host_telemetry = telemetry_table && rec.meta("host_telemetry") == "1";
  if (!d.host_telemetry)
    d.notes.push_back(telemetry_table ? "host telemetry was off for this recording (--no-host-telemetry, or the kernel "
                                        "refused it): causes on the host side cannot be seen; findings come from "
                                        "the CUDA calls alone"
                                      : "this record was written before host telemetry existed: causes on the host "
                                        "side cannot be seen; findings come from the CUDA calls alone");
  d.gpu_times = db.has_table("gpu_activities") &&
                db.prepare("SELECT 1 FROM gpu_activities WHERE kind = 'kernel' LIMIT 1").step();
  const uint64_t end_ns = uint64_t(rec.meta_i64("end_ns", 0));

  ProcessNames names;
  {
    auto q = db.prepare("SELECT pid, comm, ppid FROM processes");
    while (q.step()) {
      names.comm[uint32_t(q.i64(0))] = q.str(1);
      if (!q.is_null(2)) names.ppid[uint32_t(q.i64(0))] = uint32_t(q.i64(2));
    }
    if (d.host_telemetry) {
      auto t = db.prepare("SELECT DISTINCT waited_for_pid, waited_for_comm FROM thread_times WHERE waited_ns > 0 "
                          "UNION SELECT DISTINCT waker_pid, waker_comm FROM thread_times WHERE blocked_ns > 0");
      while (t.step())
        if (!t.is_null(0) && !names.comm.contains(uint32_t(t.i64(0)))) names.comm[uint32_t(t.i64(0))] = t.str(1);
    }
  }

  // The processes that drive a GPU: those that launched kernels or copied, busiest first.
  std::vector<uint32_t> procs;
  {
    auto q = db.prepare(
        "SELECT c.pid, count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE c.parent_id IS NULL AND "
        "f.kind IN ('launch', 'graph_launch', 'memcpy') GROUP BY c.pid ORDER BY 2 DESC LIMIT 8");
    while (q.step()) procs.push_back(uint32_t(q.i64(0)));
  }
  for (uint32_t pid : procs) {
    ProcessEvidence e;
    e.pid = pid;
    e.comm = names.comm.count(pid) ? names.comm[pid] : "";
    e.until_ns = end_ns;
    {
      auto q = db.prepare("SELECT cmdline, exit_ns FROM processes WHERE pid = ?1");
      q.bind(1, int64_t(pid));
      if (q.step()) {
        e.cmdline = q.str(0);
        if (!q.is_null(1)) e.until_ns = uint64_t(q.i64(1));
      }
    }
    {
      auto q = db.prepare(
          "SELECT c.ts_ns, coalesce(c.duration_ns, 0), f.kind, coalesce(c.host_mem, ''), coalesce(c.bytes, 0), "
          "c.func, coalesce(c.kernel_id, c.kernel_handle, 0), coalesce(c.dir, ''), c.tid, coalesce(c.stack_id, 0) "
          "FROM calls c JOIN functions f ON f.id = c.func WHERE c.pid = ?1 AND c.parent_id IS NULL ORDER BY c.ts_ns");
      q.bind(1, int64_t(pid));
      while (q.step())
        e.calls.push_back({uint64_t(q.i64(0)), uint64_t(q.i64(1)), uint32_t(q.i64(8)), q.str(2), q.str(3), q.i64(4),
                           std::hash<std::string>{}(fmt::format("{}:{}:{}", q.i64(5), q.i64(6), q.str(7))),
                           q.i64(9)});
    }
    if (d.host_telemetry) {
      // reclaim_ns came after the table: older records go without.
      const bool has_reclaim = db.has_column("thread_times", "reclaim_ns");
      const bool has_softirq = db.has_column("thread_times", "net_softirq_ns");
      const bool has_blocked_on = db.has_column("thread_times", "blocked_on");
      auto q = db.prepare(std::string(
          "SELECT tid, start_ns, end_ns, on_cpu_ns, runnable_ns, io_ns, lock_ns, fd_ns, sleep_ns, other_ns, ") +
          (has_reclaim ? "coalesce(reclaim_ns, 0)" : "0") + ", waited_ns, coalesce(waited_for_tid, 0), coalesce(waited_for_pid, 0), "
          "coalesce(waker_tid, 0), coalesce(waker_pid, 0), state, " +
          (has_softirq ? "coalesce(net_softirq_ns, 0)" : "0") + ", " +
          (has_blocked_on ? "coalesce(blocked_syscall, ''), coalesce(blocked_on, '')" : "'', ''") +
          " FROM thread_times WHERE pid = ?1 ORDER BY tid, start_ns");
      q.bind(1, int64_t(pid));
      while (q.step()) {
        ThreadWindow w;
        w.start_ns = uint64_t(q.i64(1));
        w.end_ns = uint64_t(q.i64(2));
        w.on_cpu = double(q.i64(3));
        w.runnable = double(q.i64(4));
        w.io = double(q.i64(5));
        w.lock = double(q.i64(6));
        w.fd = double(q.i64(7));
        w.sleep = double(q.i64(8));
        w.other = double(q.i64(9));
        w.reclaim = double(q.i64(10));
        w.waited_ns = uint64_t(q.i64(11));
        w.waited_for_tid = uint32_t(q.i64(12));
        w.waited_for_pid = uint32_t(q.i64(13));
        w.waker_tid = uint32_t(q.i64(14));
        w.waker_pid = uint32_t(q.i64(15));
        w.state = q.str(16);
        w.net_softirq = double(q.i64(17));
        w.blocked_syscall = q.str(18);
        w.blocked_on = q.str(19);
        e.windows[uint32_t(q.i64(0))].push_back(std::move(w));
      }
    }
    if (d.gpu_times) {
      auto q = db.prepare(
          "SELECT a.start_ns, a.end_ns, coalesce(c.ts_ns, 0) FROM gpu_activities a LEFT JOIN calls c ON c.id = "
          "a.call_id WHERE a.pid = ?1 AND a.kind = 'kernel' ORDER BY a.start_ns");
      q.bind(1, int64_t(pid));
      while (q.step()) e.kernels.push_back({uint64_t(q.i64(0)), uint64_t(q.i64(1)), uint64_t(q.i64(2))});
    }
    if (const auto gpu = process_gpu(db, pid, names)) read_nvml(db, *gpu, e);
    if (db.has_table("pressure")) {
      auto q = db.prepare(
          "SELECT ts_ns, pid, coalesce(cgroup, ''), cpu_some_us, memory_some_us, memory_full_us, io_some_us, "
          "io_full_us, periods, throttled_periods, throttled_us FROM pressure WHERE pid IN (0, ?1) ORDER BY ts_ns");
      q.bind(1, int64_t(pid));
      auto opt = [&](int i) { return q.is_null(i) ? std::optional<uint64_t>() : std::optional<uint64_t>(q.i64(i)); };
      while (q.step()) {
        host::PressureReading r;
        r.ts_ns = uint64_t(q.i64(0));
        r.pid = uint32_t(q.i64(1));
        r.cgroup = q.str(2);
        r.cpu_some_us = opt(3);
        r.memory_some_us = opt(4);
        r.memory_full_us = opt(5);
        r.io_some_us = opt(6);
        r.io_full_us = opt(7);
        r.periods = opt(8);
        r.throttled_periods = opt(9);
        r.throttled_us = opt(10);
        (r.pid ? e.cgroup_pressure : e.host_pressure).push_back(std::move(r));
      }
    }
    e.site = [&sites](int64_t stack_id) { return sites ? sites->python_or_caller(stack_id) : std::string(); };
    ProcessDiagnosis p = analyze(e, names, d.host_telemetry, d.origin_ns);
    if (!p.step_ms.empty()) d.processes.push_back(std::move(p));
  }
  if (procs.empty()) d.notes.push_back("no process in this record launched a kernel or copied: nothing to diagnose");
  return d;
}

}  // namespace gpuscope::diagnose
