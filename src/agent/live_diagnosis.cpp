#include "agent/live_diagnosis.h"

#include <fmt/format.h>

#include "cuda/functions.h"

namespace gpuscope::agent {

void LiveDiagnosis::add_call(const CallEvent& e) {
  if (e.parent_id) return;  // a driver call inside a runtime call: counted with it
  const auto* f = cuda::function_by_id(e.func);
  if (!f) return;
  diagnose::CudaCall c;
  c.ts_ns = e.ts_ns;
  c.duration_ns = e.duration_ns;
  c.tid = e.tid;
  c.kind = std::string(cuda::to_string(f->kind));
  if (e.host_mem != HostMem::NotApplicable) c.host_mem = std::string(to_string(e.host_mem));
  c.bytes = int64_t(e.bytes);
  c.key = std::hash<std::string>{}(fmt::format("{}:{}:{}", e.func, e.kernel_handle, int(e.dir)));
  std::lock_guard lock(mu_);
  if (!processes_.contains(e.pid) && processes_.size() >= limits_.max_processes) return;
  auto& p = processes_[e.pid];
  if (p.comm.empty()) p.comm = e.comm;
  p.calls.push_back(std::move(c));
  if (p.calls.size() > limits_.max_calls) p.calls.pop_front();
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
  w.waited_ns = r.waited_ns;
  w.waited_for_tid = r.waited_for_tid;
  w.waited_for_pid = r.waited_for_pid;
  w.waker_tid = r.waker_tid;
  w.waker_pid = r.waker_pid;
  w.state = r.state;
  std::lock_guard lock(mu_);
  // Only for processes whose calls are kept: a worker's windows matter as a waker's name.
  if (r.waited_ns && !r.waited_for_comm.empty()) names_.comm[r.waited_for_pid] = r.waited_for_comm;
  if (r.blocked_ns && !r.waker_comm.empty()) names_.comm[r.waker_pid] = r.waker_comm;
  if (names_.comm.size() > 4 * limits_.max_processes) names_.comm.clear();
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

void LiveDiagnosis::forget_process(uint32_t pid) {
  std::lock_guard lock(mu_);
  processes_.erase(pid);
}

void LiveDiagnosis::trim(Process& p, uint64_t before_ns) {
  while (!p.calls.empty() && p.calls.front().ts_ns < before_ns) p.calls.pop_front();
  for (auto it = p.windows.begin(); it != p.windows.end();) {
    auto& q = it->second;
    while (!q.empty() && q.front().end_ns < before_ns) {
      q.pop_front();
      --p.window_count;
    }
    it = q.empty() ? p.windows.erase(it) : std::next(it);
  }
}

void LiveDiagnosis::tick(uint64_t now_ns) {
  const uint64_t from = now_ns > limits_.window_ns ? now_ns - limits_.window_ns : 0;
  // The evidence is copied under the lock and analysed without it: the pipeline thread keeps adding.
  std::vector<diagnose::ProcessEvidence> evidence;
  diagnose::ProcessNames names;
  {
    std::lock_guard lock(mu_);
    for (auto it = processes_.begin(); it != processes_.end();) {
      trim(it->second, from);
      if (it->second.calls.empty()) {
        it = processes_.erase(it);
        continue;
      }
      diagnose::ProcessEvidence e;
      e.pid = it->first;
      e.comm = it->second.comm;
      e.calls.assign(it->second.calls.begin(), it->second.calls.end());
      for (const auto& [tid, q] : it->second.windows) e.windows[tid].assign(q.begin(), q.end());
      e.until_ns = now_ns;
      evidence.push_back(std::move(e));
      names.comm[it->first] = it->second.comm;
      ++it;
    }
    for (const auto& [pid, comm] : names_.comm) names.comm.try_emplace(pid, comm);
  }
  std::vector<Current> found;
  for (const auto& e : evidence) {
    const auto d = diagnose::analyze(e, names, true, 0);
    if (d.step_ms.empty() || !d.steps.count()) continue;  // no loop seen in the window
    Current c;
    c.pid = e.pid;
    c.comm = e.comm;
    c.step_s = d.p50_ms / 1e3;
    c.steps = d.steps.count();
    for (const auto& f : d.findings)
      if (f.cause != "none") c.findings.push_back(f);
    found.push_back(std::move(c));
  }
  std::lock_guard lock(mu_);
  current_ = std::move(found);
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
                     "lock_wait, sleep, pageable_copies",
                     "ratio", MetricType::Gauge, {}};
  for (const auto& c : current()) {
    Labels base = labels_of(c.pid);
    steps.samples.push_back({base, c.step_s});
    for (const auto& f : c.findings) {
      Labels l = base;
      l.emplace_back("cause", f.cause);
      share.samples.push_back({std::move(l), f.share});
    }
  }
  return {std::move(steps), std::move(share)};
}

}  // namespace gpuscope::agent
