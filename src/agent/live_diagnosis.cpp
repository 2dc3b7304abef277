#include "agent/live_diagnosis.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "common/log.h"
#include "cuda/functions.h"
#include "diagnose/findings.h"

namespace gpuscope::agent {

void LiveDiagnosis::add_call(const CallEvent& e) {
  // A call not kept: its probes' cost goes to the calls kept.
  auto count_hit_only = [&] {
    std::lock_guard lock(mu_);
    if (auto it = processes_.find(e.pid); it != processes_.end())
      ++(e.has_return ? it->second.pair_hits : it->second.entry_hits);
  };
  if (e.parent_id) {  // a driver call inside a runtime call: analysed with it
    count_hit_only();
    return;
  }
  const auto* f = cuda::function_by_id(e.func);
  if (!f) return;
  // What the analysis reads: work for the GPU and syncs (the steps' pattern), and calls long enough
  // to matter to the host's time (an allocation that waits, a free that syncs). A start-up's
  // thousands of kernel registrations a second would fill the window and push out its launches.
  const bool kept = f->kind == cuda::CallKind::Launch || f->kind == cuda::CallKind::GraphLaunch ||
                    f->kind == cuda::CallKind::Memcpy || f->kind == cuda::CallKind::Memset ||
                    f->kind == cuda::CallKind::Sync || e.duration_ns >= kLongCallNs;
  if (!kept) {
    count_hit_only();
    return;
  }
  diagnose::CudaCall c;
  c.ts_ns = e.ts_ns;
  c.duration_ns = e.duration_ns;
  c.tid = e.tid;
  c.kind = f->kind;
  c.pageable = e.host_mem == HostMem::Pageable;
  c.bytes = int64_t(e.bytes);
  // What was called, mixed into one word (the pipeline thread does this for every call).
  uint64_t key = (uint64_t(e.func) << 8 | uint64_t(e.dir)) * 0x9E3779B97F4A7C15ull;
  key ^= uint64_t(e.kernel_handle) + 0x7F4A7C159E3779B9ull + (key << 6) + (key >> 2);
  c.key = key;
  c.to_device = e.dir == cuda::CopyDir::HostToDevice;
  std::lock_guard lock(mu_);
  if (!processes_.contains(e.pid) && processes_.size() >= limits_.max_processes) return;
  auto& p = processes_[e.pid];
  if (p.comm.empty()) {
    p.comm = e.comm;
    if (traced_.size() < 4 * limits_.max_processes) traced_[e.pid] = e.comm;
  }
  ++(e.has_return ? p.pair_hits : p.entry_hits);
  ++p.top_calls;
  p.calls.push_back(std::move(c));
  if (p.calls.size() > limits_.max_calls) p.calls.pop_front();
}

void LiveDiagnosis::add_kernel_sample(uint64_t ts_ns, uint32_t pid, uint32_t tid, const std::string& what) {
  std::lock_guard lock(mu_);
  const auto p = processes_.find(pid);
  if (p == processes_.end()) return;  // samples alone do not make a process analysed
  auto& q = p->second.kernel_samples;
  q.push_back({ts_ns, tid, what});
  if (q.size() > limits_.max_windows) q.pop_front();
}

void LiveDiagnosis::add_thread_time(const store::ThreadTimeRow& r) {
  diagnose::ThreadWindow w;
  w.start_ns = r.start_ns;
  w.end_ns = r.end_ns;
  w.on_cpu = double(r.on_cpu_ns);
  w.runnable = double(r.runnable_ns);
  w.io = double(r.io_ns);
  w.lock = double(r.lock_ns);
  w.fd = double(r.fd_ns);
  w.sleep = double(r.sleep_ns);
  w.other = double(r.other_ns);
  w.reclaim = double(r.reclaim_ns);
  w.net_softirq = double(r.net_softirq_ns);
  w.sys = double(r.sys_ns);
  w.blocked_syscall = r.blocked_syscall;
  w.blocked_on = r.blocked_on;
  w.waited_ns = r.waited_ns;
  w.waited_for_tid = r.waited_for_tid;
  w.waited_for_pid = r.waited_for_pid;
  w.waker_tid = r.waker_tid;
  w.waker_pid = r.waker_pid;
  w.state = r.state;
  std::lock_guard lock(mu_);
  // Only for processes whose calls are kept: a worker's windows matter as a waker's name.
  if (r.waited_ns && !r.waited_for_comm.empty()) names_.comm[r.waited_for_pid] = r.waited_for_comm;
  if (r.waited_ns && r.waited_for_kthread) names_.kernel_threads.insert(r.waited_for_pid);
  if (r.blocked_ns && !r.waker_comm.empty()) names_.comm[r.waker_pid] = r.waker_comm;
  if (names_.comm.size() > 4 * limits_.max_processes) names_.comm.clear();
  if (names_.kernel_threads.size() > 4 * limits_.max_processes) names_.kernel_threads.clear();
  auto it = processes_.find(r.pid);
  if (it == processes_.end()) return;
  auto& p = it->second;
  auto& q = p.windows[r.tid];
  q.push_back(std::move(w));
  if (++p.window_count > limits_.max_windows) {
    // Too many threads' windows: the oldest of this thread go first.
    q.pop_front();
    --p.window_count;
  }
}

void LiveDiagnosis::add_gpu_batch(const gpu::NvmlSampler::Batch& b) {
  std::lock_guard lock(mu_);
  for (const auto& s : b.samples) {
    diagnose::GpuReading r;
    r.ts_ns = s.ts_ns;
    if (s.gpu_util) r.util = double(*s.gpu_util) / 100;
    if (s.sm_clock_mhz) r.sm_clock_mhz = double(*s.sm_clock_mhz);
    if (s.sm_active) r.sm_active = *s.sm_active / 100;
    if (s.throttle_reasons) r.throttle_reasons = *s.throttle_reasons;
    if (s.pcie_tx_kbs && s.pcie_rx_kbs) r.pcie_bytes_per_s = double(*s.pcie_tx_kbs + *s.pcie_rx_kbs) * 1024;
    auto& q = gpus_[s.device].readings;
    q.push_back(r);
    if (q.size() > limits_.max_windows) q.pop_front();
  }
  for (const auto& ev : b.events) {
    if (ev.kind != "xid") continue;
    auto& q = gpus_[ev.device].xids;
    q.push_back({ev.ts_ns, uint32_t(ev.value)});
    if (q.size() > kMaxXids) q.pop_front();
  }
  for (const auto& s : b.processes) {
    auto& q = gpus_[s.device].processes;
    q.push_back({s.ts_ns, s.pid, s.sm_util ? double(*s.sm_util) / 100 : -1});
    if (q.size() > limits_.max_windows) q.pop_front();
    // Any process NVML lists (ones with a context on a GPU), its calls seen yet or not.
    if (process_gpu_.contains(s.pid) || process_gpu_.size() < 4 * limits_.max_processes)
      process_gpu_[s.pid] = s.device;
  }
}

void LiveDiagnosis::add_pressure(const host::PressureReading& r) {
  std::lock_guard lock(mu_);
  if (r.pid && !processes_.contains(r.pid)) return;
  auto& q = pressure_[r.pid];
  q.push_back(r);
  if (q.size() > 64) q.pop_front();
}

void LiveDiagnosis::forget_process(uint32_t pid) {
  std::lock_guard lock(mu_);
  processes_.erase(pid);
  process_gpu_.erase(pid);
  pressure_.erase(pid);
  traced_.erase(pid);
}

void LiveDiagnosis::high_rate_probes(uint32_t pid, bool on, uint64_t t_ns) {
  std::lock_guard lock(mu_);
  if (!processes_.contains(pid) && processes_.size() >= limits_.max_processes) return;
  auto& p = processes_[pid];
  if (!on) {
    if (!p.off_since) p.off_since = t_ns;
  } else if (p.off_since) {
    p.unobserved.emplace_back(p.off_since, std::max(t_ns, p.off_since));
    if (p.unobserved.size() > 64) p.unobserved.pop_front();
    p.off_since = 0;
  }
}

void LiveDiagnosis::set_probe_costs(double entry_ns, double pair_ns) {
  std::lock_guard lock(mu_);
  entry_hit_ns_ = entry_ns;
  pair_hit_ns_ = pair_ns;
}

void LiveDiagnosis::trim(Process& p, uint64_t before_ns) {
  while (!p.calls.empty() && p.calls.front().ts_ns < before_ns) p.calls.pop_front();
  while (!p.unobserved.empty() && p.unobserved.front().second < before_ns) p.unobserved.pop_front();
  while (!p.kernel_samples.empty() && p.kernel_samples.front().ts_ns < before_ns) p.kernel_samples.pop_front();
  for (auto it = p.windows.begin(); it != p.windows.end();) {
    auto& q = it->second;
    while (!q.empty() && q.front().end_ns < before_ns) {
      q.pop_front();
      --p.window_count;
    }
    it = q.empty() ? p.windows.erase(it) : std::next(it);
  }
}

std::optional<uint64_t> LiveDiagnosis::settled_from(const std::vector<double>& step_ms,
                                                    const std::vector<uint64_t>& start_ns) {
  if (step_ms.empty() || step_ms.size() != start_ns.size()) return std::nullopt;
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  size_t first = 0;
  const double typical = median(step_ms);
  while (first < step_ms.size() && step_ms[first] > kStartUpStepFactor * typical) ++first;
  const size_t rest = step_ms.size() - first;
  double rest_ms = 0;
  for (size_t i = first; i < step_ms.size(); ++i) rest_ms += step_ms[i];
  if (rest < kSettledSteps && rest_ms < kSettledMs) return std::nullopt;
  if (rest >= 4) {
    const auto mid = step_ms.begin() + long(first + rest / 2);
    const double earlier = median({step_ms.begin() + long(first), mid}), later = median({mid, step_ms.end()});
    if (later < kStillFaster * earlier) return std::nullopt;  // still getting faster: warming up
  }
  return start_ns[first];
}

bool LiveDiagnosis::drop_start_up_readings(diagnose::ProcessEvidence& e, uint64_t steady_from_ns) {
  const bool read = !e.gpu.empty();
  const uint64_t from = steady_from_ns + kNvmlReadingSpanNs;
  std::erase_if(e.gpu, [&](const diagnose::GpuReading& r) { return r.ts_ns < from; });
  std::erase_if(e.gpu_processes, [&](const diagnose::GpuProcessReading& r) { return r.ts_ns < from; });
  return !read || !e.gpu.empty();
}

void LiveDiagnosis::tick(uint64_t now_ns) {
  const uint64_t from = now_ns > limits_.window_ns ? now_ns - limits_.window_ns : 0;
  // The evidence is copied under the lock and analysed without it: the pipeline thread keeps adding.
  std::vector<diagnose::ProcessEvidence> evidence;
  diagnose::ProcessNames names;
  std::vector<uint32_t> unseen;  // no whole step in the window
  std::map<uint32_t, int> starting;  // pid -> its warming_ticks: where its start-up ends is not known yet
  std::vector<uint32_t> warming;      // analysed now and still getting faster
  std::map<uint32_t, uint64_t> first_steps;
  {
    std::lock_guard lock(mu_);
    for (auto it = processes_.begin(); it != processes_.end();) {
      trim(it->second, std::max(from, it->second.steady_from_ns));
      if (!it->second.steady_from_ns && limits_.skip_start_up) starting[it->first] = it->second.warming_ticks;
      if (it->second.calls.empty() && it->second.off_since) {
        // No call seen while its probes are off: the last analysis stands (hold_ns).
        unseen.push_back(it->first);
        ++it;
        continue;
      }
      if (it->second.calls.empty()) {
        pressure_.erase(it->first);
        it = processes_.erase(it);
        continue;
      }
      diagnose::ProcessEvidence e;
      e.pid = it->first;
      e.comm = it->second.comm;
      e.calls.assign(it->second.calls.begin(), it->second.calls.end());
      for (const auto& [tid, q] : it->second.windows) e.windows[tid].assign(q.begin(), q.end());
      e.until_ns = now_ns;
      e.unobserved.assign(it->second.unobserved.begin(), it->second.unobserved.end());
      e.kernel_samples.assign(it->second.kernel_samples.begin(), it->second.kernel_samples.end());
      if (it->second.off_since) e.unobserved.emplace_back(it->second.off_since, now_ns);
      auto& q = it->second;
      if (q.top_calls > 0)
        e.probe_ns_per_call = (q.entry_hits * entry_hit_ns_ + q.pair_hits * pair_hit_ns_) / q.top_calls;
      q.entry_hits /= 2;
      q.pair_hits /= 2;
      q.top_calls /= 2;
      // Its GPU's readings: where NVML saw it, else the only GPU there is.
      const auto g = process_gpu_.find(it->first);
      const auto gpu = g != process_gpu_.end() ? gpus_.find(g->second) : gpus_.size() == 1 ? gpus_.begin() : gpus_.end();
      if (gpu != gpus_.end()) {
        e.gpu.assign(gpu->second.readings.begin(), gpu->second.readings.end());
        e.gpu_processes.assign(gpu->second.processes.begin(), gpu->second.processes.end());
      }
      if (const auto h = pressure_.find(0); h != pressure_.end())
        e.host_pressure.assign(h->second.begin(), h->second.end());
      if (const auto c = pressure_.find(it->first); c != pressure_.end())
        e.cgroup_pressure.assign(c->second.begin(), c->second.end());
      if (it->second.steady_from_ns && !drop_start_up_readings(e, it->second.steady_from_ns)) {
        unseen.push_back(it->first);  // not yet a reading of its settled steps
        ++it;
        continue;
      }
      evidence.push_back(std::move(e));
      names.comm[it->first] = it->second.comm;
      ++it;
    }
    for (const auto& [pid, comm] : names_.comm) names.comm.try_emplace(pid, comm);
    names.kernel_threads = names_.kernel_threads;
    names.observer = uint32_t(getpid());
    for (auto& [device, gpu] : gpus_) {
      while (!gpu.readings.empty() && gpu.readings.front().ts_ns < from) gpu.readings.pop_front();
      while (!gpu.processes.empty() && gpu.processes.front().ts_ns < from) gpu.processes.pop_front();
    }
  }
  std::vector<Current> found;
  for (auto& e : evidence) {
    auto d = diagnose::analyze(e, names, true, 0, diagnose::SlowSteps::RankedAmongThemselves);
    if (d.step_ms.empty() || !d.steps.count()) {
      if (g_verbose) {
        size_t work = 0;
        for (const auto& c : e.calls) work += c.gpu_work();
        log_debug("PID {}: no step seen whole in the last {:.1f} s: {} calls ({} launches, copies or memsets), {} "
                  "steps in their pattern, {} spans with the launch probes off",
                  e.pid, double(limits_.window_ns) / 1e9, e.calls.size(), work, d.steps.count(), e.unobserved.size());
      }
      unseen.push_back(e.pid);
      continue;
    }
    if (starting.contains(e.pid)) {
      auto steady = settled_from(d.step_ms, d.step_start_ns);
      if (!steady && starting[e.pid] + 1 < kMaxStartUpTicks) {
        warming.push_back(e.pid);
        continue;
      }
      if (!steady) steady = d.step_start_ns.back() + uint64_t(d.step_ms.back() * 1e6);
      first_steps[e.pid] = *steady;
      // Its slow first steps and the GPU's readings of its start-up left out, the rest is analysed
      // now: a cause there from the start is told at once, not a tick later.
      std::erase_if(e.calls, [&](const diagnose::CudaCall& c) { return c.ts_ns < *steady; });
      if (!drop_start_up_readings(e, *steady)) continue;  // not yet a reading of its settled steps
      d = diagnose::analyze(e, names, true, 0, diagnose::SlowSteps::RankedAmongThemselves);
      if (d.step_ms.empty() || !d.steps.count()) continue;
    }
    Current c;
    c.analysed_ns = now_ns;
    c.pid = e.pid;
    c.comm = e.comm;
    c.step_s = d.p50_ms / 1e3;
    c.steps = d.steps.count();
    for (size_t i = 0; i < d.step_ms.size(); ++i) c.recent_steps.emplace_back(d.step_start_ns[i], d.step_ms[i]);
    c.unobserved = e.unobserved;
    for (const auto& f : d.findings)
      if (f.cause != "none") c.findings.push_back(f);
    found.push_back(std::move(c));
  }
  std::lock_guard lock(mu_);
  for (const auto& [pid, ts] : first_steps)
    if (auto p = processes_.find(pid); p != processes_.end()) p->second.steady_from_ns = ts;
  for (uint32_t pid : warming)
    if (auto p = processes_.find(pid); p != processes_.end()) ++p->second.warming_ticks;
  for (const auto& c : current_)
    if (std::find(unseen.begin(), unseen.end(), c.pid) != unseen.end() && now_ns - c.analysed_ns < limits_.hold_ns)
      found.push_back(c);
  add_xid_findings(found, now_ns);
  constexpr uint64_t kRetellNs = 60'000'000'000;
  for (const auto& c : found)
    for (const auto& f : c.findings) {
      const bool had = std::any_of(current_.begin(), current_.end(), [&](const Current& o) {
        return o.pid == c.pid && std::any_of(o.findings.begin(), o.findings.end(),
                                             [&](const diagnose::Finding& g) { return g.cause == f.cause; });
      });
      auto& last = reported_[{c.pid, f.cause}];
      if (had || (last && now_ns - last < kRetellNs) || onsets_.size() >= 256) continue;
      last = now_ns;
      onsets_.push_back({now_ns, c.pid, c.comm, f});
    }
  // Forget what was told of processes no longer seen.
  for (auto it = reported_.begin(); it != reported_.end();)
    it = processes_.contains(it->first.first) ? std::next(it) : reported_.erase(it);
  current_ = std::move(found);
}

void LiveDiagnosis::add_xid_findings(std::vector<Current>& found, uint64_t now_ns) {
  for (auto& [device, gpu] : gpus_) {
    while (!gpu.xids.empty() && gpu.xids.front().ts_ns + kXidHoldNs < now_ns) gpu.xids.pop_front();
    if (gpu.xids.empty()) continue;
    // The processes on it: those NVML lists there (a hung one too), those it was last seen on,
    // and with one GPU, every process traced.
    std::set<uint32_t> on_it;
    for (const auto& r : gpu.processes) on_it.insert(r.pid);
    for (const auto& [pid, dev] : process_gpu_)
      if (dev == device) on_it.insert(pid);
    if (gpus_.size() == 1)
      for (const auto& [pid, comm] : traced_) on_it.insert(pid);
    const std::vector<diagnose::XidEvent> xids(gpu.xids.begin(), gpu.xids.end());
    // Over the analysis window, or since the first report if it came before: its share is the part
    // of that time after the first report.
    const uint64_t window_start = now_ns > limits_.window_ns ? now_ns - limits_.window_ns : 0;
    const auto xid = diagnose::xid_finding(xids, std::min(window_start, xids.front().ts_ns), now_ns, now_ns, 0);
    if (!xid) continue;
    for (uint32_t pid : on_it) {
      // Only processes the agent traces: NVML lists every process with a context on the GPU.
      const auto traced = traced_.find(pid);
      if (traced == traced_.end()) continue;
      auto c = std::find_if(found.begin(), found.end(), [&](const Current& o) { return o.pid == pid; });
      if (c == found.end()) {
        found.push_back(Current{.pid = pid, .comm = traced->second, .analysed_ns = now_ns});
        c = std::prev(found.end());
      }
      auto& f = c->findings;
      f.erase(std::remove_if(f.begin(), f.end(), [](const diagnose::Finding& g) { return g.cause == "gpu_error"; }),
              f.end());
      // A GPU that failed comes before any slowness; an error in the program's work, by its share.
      const auto at = xid->fatal ? f.begin() : std::find_if(f.begin(), f.end(), [&](const diagnose::Finding& g) {
        return g.share < xid->finding.share;
      });
      f.insert(at, xid->finding);
    }
  }
}

std::vector<LiveDiagnosis::Onset> LiveDiagnosis::take_onsets() {
  std::lock_guard lock(mu_);
  return std::exchange(onsets_, {});
}

std::vector<LiveDiagnosis::Current> LiveDiagnosis::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

std::vector<MetricFamily> LiveDiagnosis::families(const std::function<Labels(uint32_t)>& labels_of) const {
  MetricFamily steps{"gpuscope_step_seconds",
                     "Median step time of the process's training or inference loop over the last seconds (found "
                     "from the pattern of its CUDA calls)",
                     "seconds", MetricType::Gauge, {}};
  MetricFamily share{"gpuscope_finding_share",
                     "Share of the process's step time a cause explains over the last seconds (gpuscope diagnose's "
                     "findings, live): cpu_contention, cpu_throttling, memory_pressure, io_wait, input_wait, "
                     "lock_wait, sleep, softirq, host_kernel, pageable_copies, sync_per_step, launch_bound, host_compute, "
                     "small_kernels, gpu_contention, pcie_contention, gpu_clocks_throttled, gpu_error",
                     "ratio", MetricType::Gauge, {}};
  for (const auto& c : current()) {
    Labels base = labels_of(c.pid);
    if (c.steps) steps.samples.push_back({base, c.step_s});  // none: a finding without steps (gpu_error)
    for (const auto& f : c.findings) {
      Labels l = base;
      l.emplace_back("cause", f.cause);
      share.samples.push_back({std::move(l), f.share});
    }
  }
  return {std::move(steps), std::move(share)};
}

}  // namespace gpuscope::agent
