#include "diagnose/findings.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace gpuscope::diagnose {
namespace {

std::string ms(double ns) { return fmt::format("{:.1f} ms", ns / 1e6); }

// "; 80% of it in fsync (on /data/ckpt.pt)" when one call accounts for most of `by` (keys "call"
// or "call on what"): the call, and what it was most often on where that was still known (a
// descriptor closed before it could be named leaves only the call).
// What the CPU samples of the thread in the kernel say it was doing there: the largest one or two
// of a dozen samples or more ("; its samples there: 62% in page faults, 21% in futex system calls").
std::string kernel_doing(const std::map<std::string, double>& by) {
  if (by.empty()) return "";
  double total = 0;
  std::vector<std::pair<double, std::string>> ranked;
  for (const auto& [what, n] : by) {
    total += n;
    ranked.emplace_back(n, what);
  }
  if (total < 12) return "";
  std::sort(ranked.rbegin(), ranked.rend());
  auto named = [](const std::string& what) {
    return what == "page faults" || what == "interrupts" ? what : what + " system calls";
  };
  std::string out = fmt::format("; its CPU samples there: {} in {}", pct(ranked[0].first / total), named(ranked[0].second));
  if (ranked.size() > 1 && ranked[1].first >= 0.15 * total)
    out += fmt::format(", {} in {}", pct(ranked[1].first / total), named(ranked[1].second));
  return out;
}

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
// The thread that feeds the GPU paces it when it works this share of the step or more, and
// waits for the GPU this share at most.
constexpr double kHostPacedBusy = 0.85, kHostPacedWait = 0.05;
// GPM: the GPU counted busy (a kernel ran) with its SMs active less than this share of that time:
// its kernels are too small to fill it (large-batch training keeps it near 1).
constexpr double kSmallKernelsActive = 0.5;
// Readings of SM activity a window needs before it says so (one a second recording; live, one
// each 10 s by default: the live windows seldom have them).
constexpr double kMinGpmReadings = 3;
// File pages read back soon after their eviction, bytes a second, above which I/O waits are the
// page cache's shortage (a dataset that no longer fits the job's memory) rather than the disk's.
constexpr double kRefaultBytesPerS = 10e6;
// TCP segments retransmitted, of those sent, from which a wait on remote input names the network.
constexpr double kRetransShare = 0.01;
// A cgroup throttled in at least this share of its quota periods holds back all its threads.
constexpr double kThrottledMost = 0.5;

}  // namespace

std::string pct(double share) { return fmt::format("{:.0f}%", share * 100); }

std::string names_of(const std::set<uint32_t>& pids, const ProcessNames& names) {
  std::string out;
  for (uint32_t pid : pids) out += (out.empty() ? "" : ", ") + names.of(pid);
  return out;
}

std::pair<uint32_t, double> top(const std::map<uint32_t, double>& by) {
  std::pair<uint32_t, double> best{0, 0};
  double total = 0;
  for (const auto& [pid, v] : by) {
    total += v;
    if (v > best.second) best = {pid, v};
  }
  return {best.first, total > 0 ? best.second / total : 0};
}

namespace {

// Its time on a CPU in the kernel for itself: system time less the softirqs that ran on its CPU,
// outside storms of packets on its CPU.
double kernel_time(const Breakdown& b) {
  return std::max(0.0, (b.sys - b.storm_sys) - (b.net_softirq - b.storm_softirq));
}

// Under a storm of packets on its CPU (a tenth of its time in softirqs or more), its system time
// beyond the softirqs measured: the interrupts' own cost. In a loopback flood steered onto a
// training loop's CPU (H100 VM, 2026-11-27) its system time went from 0.05 to 2.6 ms a step, the
// softirqs measured 0.8, its user time did not grow, and the step grew by 2 ms: that time is the
// flood's. (Until then it was taken for tick-sampling noise and left out, and the thread's own
// work seemed to have doubled: launch_bound.)
double storm_extra(const Breakdown& b) { return std::max(0.0, b.storm_sys - b.storm_softirq); }

}  // namespace

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
  double idle = gpu_view ? 1 - busy : 1;
  // gpuscope's own probes: their traps and programs run in the kernel, in the job's threads, and
  // where the host fed the GPU, the GPU waited for them. Neither is the job's doing: their time is
  // no host cause's, and the GPU's idle time they account for is left out of what host causes can
  // explain.
  const double probes = std::min(b.probes, b.on_cpu);
  b.on_cpu -= probes;
  if (b.sys > 0) b.storm_sys *= std::max(0.0, b.sys - probes) / b.sys;  // the probes' share of it
  b.sys = std::max(0.0, b.sys - probes);
  // The host's own work for the GPU: on a CPU outside CUDA calls, plus what launching costs (a
  // launch that waits for a full queue is the GPU's doing, not the host's).
  // Handed off, the work went on in another of its launching threads (autograd's backward pass):
  // that thread's running is the host's work too.
  const double own_work = std::max(0.0, b.on_cpu - b.net_softirq - storm_extra(b) - kernel_time(b) - b.in_cuda) +
                          std::min(b.in_launch, b.launches * kLaunchNs) + b.handoff;
  // The thread that feeds the GPU worked all the step and never waited for the GPU (no sync, no
  // copy, no launch held by a full queue): the host sets the pace, and the GPU, which would
  // otherwise have filled the queue, idled for part of it whatever NVML's utilisation says. NVML
  // counts a sample period busy if a kernel ran in it: between short kernels it reads near 100%
  // (a Transformer's inference at batch 1 on the H200: NVML 99%, its kernels 72% of the step by
  // CUPTI, GPM's SM activity 73%). The SMs' activity is the GPU's busy time at most (a kernel
  // that fills none of them is busy with none active), so the GPU idled that much at most.
  const double waited_for_gpu = b.in_sync + b.in_copy + std::max(0.0, b.in_launch - b.launches * kLaunchNs);
  const bool host_paced = telemetry && gpu_view && !b.gpu_known && b.launches > 0 &&
                          (own_work - b.handoff) / b.window_ns >= kHostPacedBusy &&
                          waited_for_gpu / b.window_ns <= kHostPacedWait;
  std::string idle_bounds;
  if (host_paced && b.sm_active_n >= kMinGpmReadings) {
    const double active = b.sm_active / b.sm_active_n;
    if (1 - active > idle) {
      idle_bounds = fmt::format(" at most (its SMs active {} by GPM; NVML's utilisation, {}, counts short kernels' "
                                "gaps as busy; the thread never waited for the GPU: {} of the step in syncs, copies "
                                "and full launch queues)",
                                pct(active), pct(busy), pct(waited_for_gpu / b.window_ns));
      idle = 1 - active;
    }
  }
  const double host_idle = gpu_view ? std::max(0.0, idle - probes / b.window_ns) : idle;
  // Busy the whole step at a few tens of µs a launch: the host launches no faster than the GPU
  // runs what it launches.
  const bool launch_limited = telemetry && b.launches > 0 && own_work / b.window_ns >= 0.5 &&
                              own_work / b.launches <= kLaunchBoundNsPerLaunch;
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
    add_share(std::move(cause), std::move(title), std::min(ns / b.window_ns, host_idle), std::move(evidence),
              std::move(fix), std::move(confidence));
  };
  const std::string gpu_idle_note =
      gpu_view ? fmt::format("; the GPU was idle {} of the steps{}", pct(idle), idle_bounds) : std::string();

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
    if (pcie_loaded_by_others(external, own))
      add_share("pcie_contention", kPcieContentionTitle, gpu_view ? std::min(idle, external / (external + own)) : 0,
                fmt::format("PCIe carried {:.1f} GB/s while this process copied {:.2f} GB/s; also on the GPU: {}{}",
                            total / 1e9, own / 1e9, names_of(b.gpu_tenants, names), gpu_idle_note),
                kPcieContentionFix, "medium");
  }
  // Kernels too small for the GPU (GPM's SM activity): NVML counts the GPU busy while any kernel
  // runs, however few of its SMs that kernel uses. The SMs' idle share of the busy time is what a
  // fuller kernel (a bigger batch) could have used.
  if (b.sm_active_n >= kMinGpmReadings && busy >= 0) {
    const double util = b.sm_active_util / b.sm_active_n, active = b.sm_active / b.sm_active_n;
    if (util >= 0.5 && active < kSmallKernelsActive * util && b.launches > 0) {
      const double unused = 1 - active / util;
      const double gpu_ns_per_launch = busy * b.window_ns / b.launches;
      const std::string evidence = fmt::format(
          "NVML counted the GPU busy {} of the time, yet its SMs had work {} of it (GPM): {} of the SMs idle while "
          "kernels ran; {:.0f} launches a step, {:.0f} µs of busy GPU time each",
          pct(util), pct(active), pct(unused), b.launches / b.steps, gpu_ns_per_launch / 1e3);
      if (launch_limited)
        add_share("launch_bound", "The GPU waits for kernels to be launched: they are shorter than their launch",
                  busy * unused,
                  evidence + fmt::format("; the threads that feed the GPU ran {} of the step at {:.0f} µs of host "
                                         "time a launch: the host launches no faster than the GPU runs them",
                                         pct(own_work / b.window_ns), own_work / b.launches / 1e3),
                  "Give each kernel more work: a bigger batch (or more requests at once); fewer, fused kernels "
                  "(torch.compile); or capture the step in a CUDA graph (torch.compile(mode=\"reduce-overhead\"), "
                  "torch.cuda.graphs)",
                  "high");
      else
        add_share("small_kernels", "The GPU's kernels are too small to fill it", busy * unused, evidence,
                  "Give each kernel more work: a bigger batch (or more requests at once); fewer, fused kernels "
                  "(torch.compile); independent work on several CUDA streams",
                  unused >= 0.7 ? "high" : "medium");
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

  double sys_explained = 0;  // kernel time a host-side finding took on
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
    const double irq = storm_extra(b);
    add("softirq", "Network packet processing (softirqs) takes the CPU of the thread that feeds the GPU",
        b.net_softirq + irq + behind_ksoftirqd,
        fmt::format("the kernel processed network packets on its CPU {} a step while it ran there{}, and it waited {} "
                    "a step behind ksoftirqd ({} of the step together){}",
                    ms(b.net_softirq / b.steps),
                    irq > 0 ? fmt::format(", and its system time meanwhile was {} a step more (the interrupts that "
                                          "bring the packets)",
                                          ms(irq / b.steps))
                            : "",
                    ms(behind_ksoftirqd / b.steps), pct((b.net_softirq + irq + behind_ksoftirqd) / b.window_ns),
                    gpu_idle_note),
        "Keep network interrupts and packet steering off the job's CPUs (IRQ affinity, the RPS/XPS masks in "
        "/sys/class/net/*/queues, irqbalance's banned CPUs), or give the job CPUs apart from them",
        "high");
    // While its cgroup's quota is spent, none of its threads runs, whoever then takes their CPU: a
    // wait for a CPU that another task held is the quota's too, up to the time cpu.stat says the
    // cgroup was throttled (some other task on the CPU ends most such waits on a busy host).
    const auto& cg = b.cgroup_pressure;
    // Behind other tasks; gpuscope's own threads aside (its overhead, bounded apart, is no finding).
    const auto by_observer = names.observer ? b.waited_for.find(names.observer) : b.waited_for.end();
    const double behind_observer = by_observer != b.waited_for.end() ? by_observer->second : 0;
    const double cpu_waits = std::max(0.0, b.runnable - b.runnable_idle - behind_ksoftirqd - behind_observer);
    const double quota_held = cg.throttled_periods >= kThrottledMost && cg.throttled > 0
                                  ? std::max(0.0, std::min(cg.throttled * b.window_ns, cpu_waits))
                                  : 0.0;
    const double contended = cpu_waits - quota_held;
    if (contended > 0) {
      std::map<uint32_t, double> others = b.waited_for;
      others.erase(0);
      others.erase(pid);  // its own threads: too many threads for the cores it has
      others.erase(names.observer);
      auto [culprit, of] = top(others);
      std::string who;
      const bool kernel_thread = culprit && names.kernel_threads.contains(culprit);
      if (culprit) {
        who = fmt::format("the CPU was held mostly by {}{} ({} of that wait)", names.of(culprit),
                          kernel_thread ? ", a kernel thread" : "", pct(of));
      } else {
        // Nobody else: its own threads, or (pid 0) the task before it was the idle one or not seen.
        const auto share_of = [&](uint32_t holder) {
          const auto it = b.waited_for.find(holder);
          double all = 0;
          for (const auto& [who_pid, ns] : b.waited_for) all += ns;
          return it != b.waited_for.end() && all > 0 ? it->second / all : 0.0;
        };
        of = share_of(pid);
        who = of >= share_of(0) ? fmt::format("the CPU was held by its own threads ({} of that wait)", pct(of))
                                : "no other process was seen holding its CPU";
      }
      add("cpu_contention", "The thread that feeds the GPU waits for a CPU", contended,
          fmt::format("runnable but not running {} a step ({} of the step); {}{}{}",
                      ms(contended / b.steps), pct(contended / b.window_ns), who,
                      b.host_pressure.cpu_some >= 0
                          ? fmt::format("; PSI: the host's tasks waited for a CPU {} of the time",
                                        pct(b.host_pressure.cpu_some))
                          : "",
                      gpu_idle_note),
          kernel_thread
              ? fmt::format("{} is the kernel's own work (deferred work, writeback, reclaim), which no renice or "
                            "taskset moves: give the job CPUs apart from the host's housekeeping (a cpuset that "
                            "leaves some CPUs to the system; isolcpus or nohz_full at boot), and see what it does "
                            "with perf record -g -p {}",
                            names.of(culprit), culprit)
          : culprit ? fmt::format("Give the job CPUs of its own (taskset or a cpuset; Kubernetes' static CPU manager "
                                  "policy), or move or renice {}", names.of(culprit))
                    : "Use fewer threads than the cores the job has (torch.set_num_threads, OMP_NUM_THREADS)",
          of >= 0.5 ? "high" : "medium");
    }
    const std::string throttled =
        cg.throttled_periods >= 0
            ? fmt::format("; cpu.stat: its cgroup ({}) was throttled in {} of its quota periods, {:.0f} ms a second",
                          cg.cgroup, pct(cg.throttled_periods), std::max(cg.throttled, 0.0) * 1e3)
            : "";
    // Throttled in most of its periods, the job's other threads are held back too: a wait for one of
    // them (a lock, the GIL) is the quota's doing. Waits ended by another process stay theirs.
    double own_waits = 0;
    if (cg.throttled_periods >= kThrottledMost && (b.runnable_idle + quota_held) / b.window_ns >= kMinShare) {
      double outside = 0;
      for (const auto& [who, ns] : b.woken_by)
        if (who != pid && who != 0) outside += ns;
      own_waits = std::max(0.0, b.lock - outside);
    }
    add("cpu_throttling", "The job's CPU quota throttles the thread that feeds the GPU",
        b.runnable_idle + quota_held + own_waits,
        fmt::format("runnable {} a step while its cgroup's quota was spent: the scheduler held it back (cgroup "
                    "cpu.max){}{}{}",
                    ms((b.runnable_idle + quota_held) / b.steps),
                    own_waits > 0 ? fmt::format(", and it waited {} a step for its own threads, throttled as well",
                                                ms(own_waits / b.steps))
                                  : "",
                    throttled, gpu_idle_note),
        "Raise the job's CPU limit (cpu.max; a Kubernetes CPU limit), or remove it", "high");
    b.lock -= own_waits;
    // Reclaiming memory itself, the thread also waits for the pages evicted to be read back: the
    // I/O is the memory's doing.
    // PSI says whether the job's tasks stalled on memory (all of them at once: `full`).
    const Pressure& mem_psi = cg.memory_full >= 0 ? cg : b.host_pressure;
    // Its I/O is reading back what the page cache just evicted: the cache is too small for the data.
    const double refaults = std::max(cg.refault_bytes_per_s, b.host_pressure.refault_bytes_per_s);
    const Pressure& refaulting = cg.refault_bytes_per_s >= b.host_pressure.refault_bytes_per_s ? cg : b.host_pressure;
    // Or it reads them back on a CPU, in the kernel (a fast disk, readahead: little I/O wait), while
    // its own cgroup evicts what it reads; the host's refaults may be any job's, so not those.
    const bool rereads =
        (b.io / b.window_ns >= kMinShare && refaults >= kRefaultBytesPerS) ||
        (kernel_time(b) / b.window_ns >= kMinShare && cg.refault_bytes_per_s >= kRefaultBytesPerS);
    const bool memory = b.reclaim / b.window_ns >= kMinShare || mem_psi.memory_full >= kMinShare || rereads;
    const std::string psi =
        mem_psi.memory_some >= 0
            ? fmt::format("; PSI: {} stalled on memory {} of the time (all its tasks at once: {})",
                          mem_psi.cgroup.empty() ? "the host's tasks" : "its cgroup's (" + mem_psi.cgroup + ") tasks",
                          pct(mem_psi.memory_some), pct(std::max(mem_psi.memory_full, 0.0)))
            : "";
    // Its time on a CPU in the kernel (system time) goes with what it did there: reading evicted
    // pages back, writing a checkpoint, receiving its input; what is left is a finding of its own.
    double kernel = kernel_time(b);
    auto in_kernel = [&](double ns) {
      return ns > 0 ? fmt::format(", and on a CPU in the kernel {} a step", ms(ns / b.steps)) : std::string();
    };
    const double memory_kernel = memory ? std::exchange(kernel, 0.0) : 0;
    add("memory_pressure", "The thread that feeds the GPU is short of memory",
        b.reclaim + (memory ? b.io : 0) + memory_kernel,
        fmt::format("reclaiming memory itself (direct reclaim) {} a step, waiting for I/O {} a step{} ({} of the "
                    "step together): its cgroup is at its memory limit or the host is short of memory, and pages "
                    "it needs are evicted and read back{}{}",
                    ms(b.reclaim / b.steps), ms(b.io / b.steps),
                    in_kernel(memory_kernel),
                    pct((b.reclaim + b.io + memory_kernel) / b.window_ns),
                    refaults >= kRefaultBytesPerS
                        ? fmt::format("; {} read back {:.0f} MB/s of file pages it had evicted (workingset refaults)",
                                      refaulting.cgroup.empty() ? "the host" : "its cgroup (" + refaulting.cgroup + ")",
                                      refaults / 1e6)
                        : "",
                    psi),
        "Raise the job's memory limit (memory.high/max; a Kubernetes memory limit), or use less host memory: "
        "fewer DataLoader workers or a smaller prefetch_factor, memory-mapped datasets instead of copies",
        "high");
    if (memory) b.io = 0;
    const double io_kernel = b.io / b.window_ns >= kMinShare ? std::exchange(kernel, 0.0) : 0;
    add("io_wait", "The thread that feeds the GPU waits for disk I/O", b.io + io_kernel,
        fmt::format("blocked in uninterruptible I/O {} a step{} ({} of the step){}{}{}",
                    ms(b.io / b.steps),
                    in_kernel(io_kernel),
                    pct((b.io + io_kernel) / b.window_ns),
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
    // A remote source over a lossy or congested path: TCP retransmits in its network namespace.
    const Pressure& net = cg.tcp_retrans_share >= 0 ? cg : b.host_pressure;
    const bool lossy = net.tcp_retrans_share >= kRetransShare;
    const std::string tcp_note =
        lossy ? fmt::format("; TCP retransmitted {} of the segments sent from {} ({:.0f} a second)",
                            pct(net.tcp_retrans_share), net.cgroup.empty() ? "the host" : "its network namespace",
                            net.tcp_retrans_per_s)
              : "";
    const std::string check_path =
        lossy ? "; the retransmits point at the network path: check the NIC's and the switch's counters "
                "(ethtool -S, drops and errors) and the link's load"
              : "";
    if (feeder && feeder_of >= 0.5) {
      const double input_kernel = waits / b.window_ns >= kMinShare ? std::exchange(kernel, 0.0) : 0;
      add("input_wait", "The thread that feeds the GPU waits for its input", waits + input_kernel,
          fmt::format("blocked on a pipe, socket or lock {} a step{} ({} of the step), woken mostly by {}{}{}{}{}{}",
                      ms(waits / b.steps),
                      in_kernel(input_kernel),
                      pct((waits + input_kernel) / b.window_ns), names.of(feeder),
                      from_child ? ", a child of the job (a data loader worker)" : "",
                      relayed ? ", through another of its threads (the DataLoader's pin-memory thread)" : "",
                      most_in(b.fd_in), tcp_note, gpu_idle_note),
          from_child ? "Give the DataLoader more workers (num_workers), make __getitem__ cheaper, or prefetch more "
                       "(prefetch_factor)"
                     : fmt::format("Make {} deliver faster, or read ahead of the step{}", names.of(feeder), check_path),
          from_child ? "high" : "medium");
    } else {
      add("lock_wait", "The thread that feeds the GPU waits on a lock held by another of its threads", b.lock,
          fmt::format("blocked in futex {} a step ({} of the step), woken by its own threads (in Python, often "
                      "the GIL held by preprocessing threads){}",
                      ms(b.lock / b.steps), pct(b.lock / b.window_ns), gpu_idle_note),
          "Move preprocessing out of the training process (DataLoader worker processes), or release the GIL in it",
          "medium");
      add("input_wait", "The thread that feeds the GPU waits on a pipe or socket", b.fd,
          fmt::format("blocked reading or polling {} a step ({} of the step){}{}{}", ms(b.fd / b.steps),
                      pct(b.fd / b.window_ns), most_in(b.fd_in), tcp_note, gpu_idle_note),
          "Read the input ahead of the step (more workers, prefetching, a local copy of remote data)" + check_path,
          "medium");
    }
    add("sleep", "The thread that feeds the GPU sleeps", b.sleep,
        fmt::format("in nanosleep {} a step ({} of the step){}", ms(b.sleep / b.steps), pct(b.sleep / b.window_ns),
                    gpu_idle_note),
        "Remove the sleep (or the polling loop that sleeps) from the training loop", "high");
    const std::string doing = kernel_doing(b.kernel_in);
    // On a CPU, in the kernel or in its own code, the thread may or may not hold the GPU up: the
    // GPU's idle time goes to its time in the kernel as that is a part of all it ran (a clean
    // loop in the kernel a fifth of its busy time is not why the GPU idles the 5% it does).
    const double host_busy = kernel + own_work;
    const double kernel_idle = host_busy > 0 ? host_idle * kernel / host_busy * b.window_ns : 0;
    add("host_kernel", "The thread that feeds the GPU works in the kernel", std::min(kernel, kernel_idle),
        fmt::format("on a CPU in the kernel{} {} a step ({} of the step){}{}{}",
                    doing.empty() ? " (system calls, page faults)" : "", ms(kernel / b.steps),
                    pct(kernel / b.window_ns), doing, gpu_idle_note,
                    kernel_idle < kernel && gpu_view
                        ? fmt::format(", of which this explains the part its time in the kernel is of all it ran for "
                                      "the GPU (its own work {} a step)",
                                      ms(own_work / b.steps))
                        : ""),
        "Make fewer, larger system calls (read in bigger chunks, or map the file), and keep page faults out of the "
        "loop (allocate and touch buffers once); `perf trace -s -p PID` counts the calls",
        "medium");
    // What host_kernel did not take is left to the thread's own work (below).
    sys_explained = kernel_time(b) - kernel + std::min(kernel, kernel_idle);
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
  // Kernel time is explained above (with what it served, or as host_kernel): not the thread's own work.
  const double blocked =
      b.runnable + b.io + b.lock + b.fd + b.sleep + b.reclaim + b.net_softirq + storm_extra(b) + sys_explained;
  const double residual = std::min({std::max(0.0, host_idle - blocked / b.window_ns - b.in_pageable_copy / b.window_ns),
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
  if (launch_limited)
    add_share("launch_bound", "The GPU waits for kernels to be launched: they are shorter than their launch",
              residual,
              fmt::format("{:.0f} launches a step at {:.0f} µs of host time each; the threads that feed the GPU ran "
                          "{} of the step while the GPU was idle {}{}",
                          b.launches / b.steps, per_launch / 1e3, pct(own_work / b.window_ns), pct(idle), idle_bounds),
              "Give each kernel more work: a bigger batch; fewer, fused kernels (torch.compile); or capture the step "
              "in a CUDA graph (torch.compile(mode=\"reduce-overhead\"), torch.cuda.graphs)",
              "high");
  else
    add_share("host_compute", "The thread that feeds the GPU computes on the CPU between launches", residual,
              fmt::format("on a CPU {} of the step, {:.1f} ms between launches on average, while the GPU was idle "
                          "{}{}",
                          pct(own_work / b.window_ns), per_launch / 1e6, pct(idle), idle_bounds),
              "Move the CPU work out of the loop: preprocessing into DataLoader workers, or onto the GPU; "
              "`record --cpu-profile 99` shows where it goes",
              "medium");
}

namespace {

struct XidMeaning {
  const char* what;
  bool fatal;  // the GPU's hardware or firmware, not the program
};

// NVIDIA's XID catalogue, the reports seen most on data-centre GPUs.
XidMeaning xid_meaning(uint32_t xid) {
  switch (xid) {
    case 13: return {"a graphics engine exception: a kernel faulted (an out-of-range access, an illegal instruction)", false};
    case 31: return {"a GPU memory page fault: a kernel touched an address it does not own", false};
    case 43: return {"the GPU stopped processing: a program's fault ended its work", false};
    case 45: return {"preemptive clean-up: a process's GPU work was stopped (it was killed or faulted)", false};
    case 48: return {"a double-bit ECC error: GPU memory returned corrupt data", true};
    case 61: case 62: return {"an internal micro-controller error", true};
    case 63: case 64: return {"ECC page retirement or row remapping (failed, for 64)", true};
    case 68: return {"a video processor exception", false};
    case 69: return {"a graphics engine class error", false};
    case 74: return {"an NVLink error", true};
    case 79: return {"the GPU has fallen off the bus: it no longer answers", true};
    case 92: return {"a high single-bit ECC error rate", true};
    case 94: return {"a contained ECC error: the process using the corrupt memory was ended", true};
    case 95: return {"an uncontained ECC error: every process on the GPU is affected", true};
    case 119: case 120: return {"the GPU's system processor (GSP) timed out or faulted", true};
    default: return {"a driver error report", false};
  }
}

}  // namespace

std::optional<XidFinding> xid_finding(const std::vector<XidEvent>& xids, uint64_t first_step_ns, uint64_t last_step_ns,
                                      uint64_t until_ns, uint64_t origin_ns) {
  std::map<uint32_t, std::pair<size_t, uint64_t>> seen;  // xid -> count, first instant
  uint64_t first = 0, last = 0;
  for (const auto& x : xids) {
    if (x.ts_ns < first_step_ns || x.ts_ns > until_ns) continue;
    auto& [n, at] = seen[x.xid];
    if (!n++) at = x.ts_ns;
    if (!first) first = x.ts_ns;
    last = x.ts_ns;
  }
  if (seen.empty()) return std::nullopt;
  bool fatal = false;
  std::string listed;
  for (const auto& [xid, v] : seen) {
    const auto m = xid_meaning(xid);
    fatal = fatal || m.fatal;
    listed += fmt::format("{}Xid {} ({}) {} time{}, first at {:.1f} s", listed.empty() ? "" : "; ", xid, m.what,
                          v.first, v.first == 1 ? "" : "s", double(v.second - std::min(v.second, origin_ns)) / 1e9);
  }
  const double span = double(last_step_ns - first_step_ns);
  const double after = first < last_step_ns ? double(last_step_ns - first) : 0;
  XidFinding out;
  out.fatal = fatal;
  out.finding = {"gpu_error",
                 fatal ? "The GPU reported a hardware fault" : "The GPU reported an error in the program's work",
                 span > 0 ? std::max(kMinShare, after / span) : kMinShare,
                 0,
                 first - std::min(first, origin_ns),
                 std::max(last, last_step_ns) - std::min(std::max(last, last_step_ns), origin_ns),
                 "the driver reported " + listed,
                 fatal ? "Take the GPU out of service and reset it (nvidia-smi -r, or reboot the node); if it comes back, "
                         "report it to the operator or vendor (nvidia-bug-report.sh)"
                       : "Find the faulting kernel: run the step under compute-sanitizer, or with CUDA_LAUNCH_BLOCKING=1 "
                         "to see which launch fails",
                 "high"};
  out.finding.ms_per_step = 0;
  return out;
}

}  // namespace gpuscope::diagnose
