#include "diagnose/analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
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
  in_sync += o.in_sync;
  in_pageable_copy += o.in_pageable_copy;
  in_copy += o.in_copy;
  in_cuda += o.in_cuda;
  syncs += o.syncs;
  pageable_copies += o.pageable_copies;
  pageable_bytes += o.pageable_bytes;
  gpu_busy += o.gpu_busy;
  gpu_known = gpu_known || o.gpu_known;
  add_map(waited_for, o.waited_for);
  add_map(woken_by, o.woken_by);
}

namespace {


// Kernel threads that end waits for disk I/O (writeback, the journal): a wait they end is I/O,
// whatever the thread slept in.
bool io_kernel_thread(const std::string& comm) {
  return comm.starts_with("kworker/") || comm.starts_with("jbd2/") || comm.starts_with("kblockd") ||
         comm.starts_with("xfs") || comm.starts_with("btrfs");
}

void findings_from(Breakdown b, const ProcessNames& names, uint32_t pid, uint64_t from, uint64_t to, bool telemetry,
                   std::vector<Finding>& out, const std::set<std::string>& have) {
  if (b.window_ns <= 0 || b.steps <= 0) return;
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
  auto add = [&](std::string cause, std::string title, double ns, std::string evidence, std::string fix,
                 std::string confidence) {
    const double share = ns / b.window_ns;
    if (share < kMinShare || have.contains(cause)) return;
    for (const auto& f : out)
      if (f.cause == cause) return;
    out.push_back({std::move(cause), std::move(title), share, ns / b.steps / 1e6, from, to, std::move(evidence),
                   std::move(fix), std::move(confidence)});
  };
  const double step = b.window_ns / b.steps;
  if (telemetry) {
    const double contended = b.runnable - b.runnable_idle;
    if (contended > 0) {
      std::map<uint32_t, double> others = b.waited_for;
      others.erase(0);
      others.erase(pid);  // its own threads: too many threads for the cores it has
      const auto [culprit, of] = top(others);
      const std::string who = culprit ? names.of(culprit) : "its own threads";
      add("cpu_contention", "The thread that feeds the GPU waits for a CPU", contended,
          fmt::format("runnable but not running {} a step ({} of the step); the CPU was held mostly by {} ({} of "
                      "that wait)",
                      ms(contended / b.steps), pct(contended / b.window_ns), who, pct(of)),
          culprit ? fmt::format("Give the job CPUs of its own (taskset or a cpuset; Kubernetes' static CPU manager "
                                "policy), or move or renice {}", who)
                  : "Use fewer threads than the cores the job has (torch.set_num_threads, OMP_NUM_THREADS)",
          of >= 0.5 ? "high" : "medium");
    }
    add("cpu_throttling", "The job's CPU quota throttles the thread that feeds the GPU", b.runnable_idle,
        fmt::format("runnable {} a step while its CPU had gone idle: the scheduler held it back (cgroup cpu.max)",
                    ms(b.runnable_idle / b.steps)),
        "Raise the job's CPU limit (cpu.max; a Kubernetes CPU limit), or remove it", "high");
    // Reclaiming memory itself, the thread also waits for the pages evicted to be read back: the
    // I/O is the memory's doing.
    const bool memory = b.reclaim / b.window_ns >= kMinShare;
    add("memory_pressure", "The thread that feeds the GPU is short of memory", b.reclaim + (memory ? b.io : 0),
        fmt::format("reclaiming memory itself (direct reclaim) {} a step and waiting for I/O {} a step ({} of the "
                    "step together): its cgroup is at its memory limit or the host is short of memory, and pages "
                    "it needs are evicted and read back",
                    ms(b.reclaim / b.steps), ms(b.io / b.steps), pct((b.reclaim + b.io) / b.window_ns)),
        "Raise the job's memory limit (memory.high/max; a Kubernetes memory limit), or use less host memory: "
        "fewer DataLoader workers or a smaller prefetch_factor, memory-mapped datasets instead of copies",
        "high");
    if (memory) b.io = 0;
    add("io_wait", "The thread that feeds the GPU waits for disk I/O", b.io,
        fmt::format("blocked in uninterruptible I/O {} a step ({} of the step), e.g. writing and fsyncing a "
                    "checkpoint, or reading data from disk",
                    ms(b.io / b.steps), pct(b.io / b.window_ns)),
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
    const double waits = b.fd + b.lock;
    if (feeder && feeder_of >= 0.5) {
      add("input_wait", "The thread that feeds the GPU waits for its input", waits,
          fmt::format("blocked on a pipe, socket or lock {} a step ({} of the step), woken mostly by {}{}",
                      ms(waits / b.steps), pct(waits / b.window_ns), names.of(feeder),
                      from_child ? ", a child of the job (a data loader worker)" : ""),
          from_child ? "Give the DataLoader more workers (num_workers), make __getitem__ cheaper, or prefetch more "
                       "(prefetch_factor)"
                     : fmt::format("Make {} deliver faster, or read ahead of the step", names.of(feeder)),
          from_child ? "high" : "medium");
    } else {
      add("lock_wait", "The thread that feeds the GPU waits on a lock held by another of its threads", b.lock,
          fmt::format("blocked in futex {} a step ({} of the step), woken by its own threads (in Python, often "
                      "the GIL held by preprocessing threads)",
                      ms(b.lock / b.steps), pct(b.lock / b.window_ns)),
          "Move preprocessing out of the training process (DataLoader worker processes), or release the GIL in it",
          "medium");
      add("input_wait", "The thread that feeds the GPU waits on a pipe or socket", b.fd,
          fmt::format("blocked reading or polling {} a step ({} of the step)", ms(b.fd / b.steps),
                      pct(b.fd / b.window_ns)),
          "Read the input ahead of the step (more workers, prefetching, a local copy of remote data)", "medium");
    }
    add("sleep", "The thread that feeds the GPU sleeps", b.sleep,
        fmt::format("in nanosleep {} a step ({} of the step)", ms(b.sleep / b.steps), pct(b.sleep / b.window_ns)),
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
  (void)step;
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
  std::set<uint32_t> cuda_threads;  // its threads that made CUDA calls
  for (const auto& [tid, n] : per_thread) cuda_threads.insert(tid);
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
  size_t seg = 0, call = 0, kern = 0;
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
      const bool handoff = g.waker_pid == pid && g.waker_tid != p.feeding_tid && cuda_threads.contains(g.waker_tid);
      (handoff ? b.handoff : b.lock) += g.lock * f;
      (handoff ? b.handoff : b.fd) += g.fd * f;
      b.sleep += g.sleep * f;
      b.other += g.other * f;
      b.runnable_idle += runnable_idle * f;
      b.reclaim += g.reclaim * f;
      if (g.runnable > 0) b.waited_for[g.waited_for_pid] += (g.runnable - runnable_idle) * f;
      if (g.io + g.lock + g.fd > 0 && !handoff) b.woken_by[g.waker_pid] += (g.io + g.lock + g.fd) * f;
    }
    b.unseen = std::max(0.0, b.window_ns - seen);
    while (call < calls.size() && calls[call]->ts_ns < s) ++call;
    for (size_t j = call; j < calls.size() && calls[j]->ts_ns < end; ++j) {
      const auto& c = *calls[j];
      b.in_cuda += double(c.duration_ns);
      if (c.kind == "sync") {
        b.in_sync += double(c.duration_ns);
        ++b.syncs;
      } else if (c.kind == "memcpy") {
        b.in_copy += double(c.duration_ns);
        if (c.host_mem == "pageable") {
          b.in_pageable_copy += double(c.duration_ns);
          ++b.pageable_copies;
          b.pageable_bytes += double(c.bytes);
        }
      }
    }
    if (!kernels.empty()) {
      b.gpu_known = true;
      while (kern < kernels.size() && kernels[kern].second <= s) ++kern;
      uint64_t covered_to = s;
      for (size_t j = kern; j < kernels.size() && kernels[j].first < end; ++j) {
        const uint64_t a = std::max({kernels[j].first, covered_to, s}), z = std::min(kernels[j].second, end);
        if (z > a) b.gpu_busy += double(z - a);
        covered_to = std::max(covered_to, z);
      }
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
  auto since_origin = [&](uint64_t t) { return t - std::min(t, origin_ns); };
  const uint64_t from = since_origin(starts.front()), to = since_origin(starts.back());
  findings_from(p.all, names, pid, from, to, telemetry, p.findings, {});
  // Causes of the slow steps alone (a hog that came for a while), in their window.
  if (p.slow_steps >= 2) {
    std::set<std::string> have;
    for (const auto& f : p.findings) have.insert(f.cause);
    findings_from(p.slow, names, pid, since_origin(slow_from), since_origin(slow_to), telemetry, p.findings, have);
  }
  std::stable_sort(p.findings.begin(), p.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.share > b.share; });
  if (p.findings.empty())
    p.findings.push_back({"none", "No problem found", 0, 0, from, to,
                          fmt::format("no cause explains {} of a step or more", pct(kMinShare)), "", "medium"});
  return p;
}

Diagnosis diagnose(store::RecordReader& rec) {
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
          "c.func, coalesce(c.kernel_id, c.kernel_handle, 0), coalesce(c.dir, ''), c.tid FROM calls c "
          "JOIN functions f ON f.id = c.func WHERE c.pid = ?1 AND c.parent_id IS NULL ORDER BY c.ts_ns");
      q.bind(1, int64_t(pid));
      while (q.step())
        e.calls.push_back({uint64_t(q.i64(0)), uint64_t(q.i64(1)), uint32_t(q.i64(8)), q.str(2), q.str(3), q.i64(4),
                           std::hash<std::string>{}(fmt::format("{}:{}:{}", q.i64(5), q.i64(6), q.str(7)))});
    }
    if (d.host_telemetry) {
      // reclaim_ns came after the table: older records go without.
      const bool has_reclaim = db.has_column("thread_times", "reclaim_ns");
      auto q = db.prepare(std::string(
          "SELECT tid, start_ns, end_ns, on_cpu_ns, runnable_ns, io_ns, lock_ns, fd_ns, sleep_ns, other_ns, ") +
          (has_reclaim ? "coalesce(reclaim_ns, 0)" : "0") + ", waited_ns, coalesce(waited_for_tid, 0), coalesce(waited_for_pid, 0), "
          "coalesce(waker_tid, 0), coalesce(waker_pid, 0), state FROM thread_times WHERE pid = ?1 ORDER BY tid, start_ns");
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
        e.windows[uint32_t(q.i64(0))].push_back(std::move(w));
      }
    }
    if (d.gpu_times) {
      auto q = db.prepare("SELECT start_ns, end_ns FROM gpu_activities WHERE pid = ?1 AND kind = 'kernel' ORDER BY start_ns");
      q.bind(1, int64_t(pid));
      while (q.step()) e.kernels.emplace_back(uint64_t(q.i64(0)), uint64_t(q.i64(1)));
    }
    ProcessDiagnosis p = analyze(e, names, d.host_telemetry, d.origin_ns);
    if (!p.step_ms.empty()) d.processes.push_back(std::move(p));
  }
  if (procs.empty()) d.notes.push_back("no process in this record launched a kernel or copied: nothing to diagnose");
  return d;
}

}  // namespace gpuscope::diagnose
