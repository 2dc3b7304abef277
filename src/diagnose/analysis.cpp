#include "diagnose/analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "diagnose/contention.h"
#include "diagnose/findings.h"

namespace gpuscope::diagnose {
namespace {

constexpr double kSlowStep = 1.25;        // a step this much longer than the median is slow
// Slow steps in a row, the last seen, this many over this long: something began (a hiccup's
// decaying tail on the H100: 21, 13, 9 and 7 ms steps against 3.7).
constexpr size_t kOnsetSteps = 3;
constexpr double kOnsetMs = 100;
constexpr uint64_t kMinSlowSpanNs = 250'000'000;  // slow steps over less time than this are a hiccup
constexpr uint64_t kFallbackWindowNs = 1'000'000'000;
// How long a thread's last window's state, on a CPU or runnable, is taken to last (see
// thread_segments): a thread that keeps its CPU sends a window at the first profile sample past
// GS_SAMPLED_WINDOW_NS (50 ms).
constexpr uint64_t kTrailingStateNs = 60'000'000;
// Pieces of a span with the launches unobserved (ProcessEvidence::unobserved): about a step.
constexpr uint64_t kMinDarkPieceNs = 10'000'000, kMaxDarkPieceNs = 250'000'000;

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
  // After its last window: a blocked thread's wait goes on until the wake-up that would send the
  // next one. Any other state may have changed within the next window's first GS_THREAD_WINDOW_NS
  // without a word (a preempted thread back on its CPU, a running one blocked): it stands a while
  // (a thread that keeps its CPU sends windows at its profile samples), and what follows is not
  // seen. Taken as lasting, a preemption at the last window's end made a thread that then ran for
  // half a second look runnable throughout.
  if (!out.empty() && state != "exited" && until_ns > out.back().w.end_ns) {
    const uint64_t from = out.back().w.end_ns;
    const bool blocked = state == "io" || state == "lock" || state == "fd" || state == "sleep" || state == "other";
    out.push_back({in_state(from, blocked ? until_ns : std::min(until_ns, from + kTrailingStateNs), state)});
  }
  return out;
}

// What another thread was doing over [t0, t1): its segments' states, prorated.
struct Composition {
  double on_cpu = 0, runnable = 0, runnable_idle = 0, io = 0, lock = 0, fd = 0, sleep = 0, other = 0;
  std::map<uint32_t, double> waited_for;  // pid -> its runnable time behind it
  std::vector<std::pair<const ThreadWindow*, double>> blocked;  // windows it blocked in, and how long
  double total() const { return on_cpu + runnable + io + lock + fd + sleep + other; }
};

Composition composition(const std::vector<Segment>& segments, uint64_t t0, uint64_t t1) {
  Composition c;
  auto it = std::lower_bound(segments.begin(), segments.end(), t0,
                             [](const Segment& g, uint64_t t) { return g.w.end_ns <= t; });
  for (; it != segments.end() && it->w.start_ns < t1; ++it) {
    const auto& g = it->w;
    const double len = double(g.end_ns - g.start_ns);
    if (len <= 0) continue;
    const double f = overlap(g.start_ns, g.end_ns, t0, t1) / len;
    c.on_cpu += g.on_cpu * f;
    c.runnable += g.runnable * f;
    c.runnable_idle += it->runnable_idle * f;
    c.io += g.io * f;
    c.lock += g.lock * f;
    c.fd += g.fd * f;
    c.sleep += g.sleep * f;
    c.other += g.other * f;
    if (g.runnable > 0) c.waited_for[g.waited_for_pid] += (g.runnable - it->runnable_idle) * f;
    if (g.io + g.lock + g.fd > 0) c.blocked.push_back({&g, (g.io + g.lock + g.fd) * f});
  }
  return c;
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
  if (r[a].tcp_out_segs && r[b].tcp_out_segs && r[a].tcp_retrans_segs && r[b].tcp_retrans_segs &&
      *r[b].tcp_out_segs > *r[a].tcp_out_segs && *r[b].tcp_retrans_segs >= *r[a].tcp_retrans_segs) {
    const double retrans = double(*r[b].tcp_retrans_segs - *r[a].tcp_retrans_segs);
    p.tcp_retrans_per_s = retrans / (dt_us / 1e6);
    p.tcp_retrans_share = retrans / double(*r[b].tcp_out_segs - *r[a].tcp_out_segs);
  }
  if (r[a].refault_file && r[b].refault_file && *r[b].refault_file >= *r[a].refault_file)
    p.refault_bytes_per_s = double(*r[b].refault_file - *r[a].refault_file) * 4096 / (dt_us / 1e6);  // x86-64 pages
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
  sys += o.sys;
  storm_sys += o.storm_sys;
  storm_softirq += o.storm_softirq;
  in_sync += o.in_sync;
  in_pageable_copy += o.in_pageable_copy;
  in_copy += o.in_copy;
  in_cuda += o.in_cuda;
  syncs += o.syncs;
  probes += o.probes;
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
  sm_active += o.sm_active;
  sm_active_util += o.sm_active_util;
  sm_active_n += o.sm_active_n;
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
  for (const auto& [k, v] : o.kernel_in) kernel_in[k] += v;
}

double Breakdown::busy_share() const {
  if (window_ns <= 0) return -1;
  if (gpu_known) return std::min(1.0, gpu_busy / window_ns);
  if (gpu_util_n > 0) return gpu_util / gpu_util_n;
  return -1;
}


std::string ProcessNames::of(uint32_t pid) const {
  auto it = comm.find(pid);
  return it == comm.end() || it->second.empty() ? fmt::format("pid {}", pid) : fmt::format("{} (pid {})", it->second, pid);
}

ProcessDiagnosis analyze(const ProcessEvidence& e, const ProcessNames& names, bool telemetry, uint64_t origin_ns,
                         SlowSteps slow_ranking) {
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
    if (c.gpu_work())
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
  // The process's calls, as the steps' pattern (those seen while its launches and copies were:
  // the syncs alone, seen throughout, are not the pattern); the feeding thread's, for where its
  // time went.
  std::vector<Token> tokens;
  std::vector<const CudaCall*> calls;
  size_t off = 0;
  for (const auto& c : e.calls) {
    while (off < e.unobserved.size() && e.unobserved[off].second <= c.ts_ns) ++off;
    const bool seen_whole = off == e.unobserved.size() || c.ts_ns < e.unobserved[off].first;
    if (seen_whole && (c.gpu_work() || c.kind == cuda::CallKind::Sync))
      tokens.push_back({c.ts_ns, c.key, c.kind == cuda::CallKind::Memcpy && c.to_device});
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
  // The other launching threads' time: a wait handed off to one of them stalls for what stalled it.
  std::map<uint32_t, std::vector<Segment>> partners;
  if (telemetry)
    for (uint32_t tid : launching_threads)
      if (const auto pw = e.windows.find(tid); tid != p.feeding_tid && pw != e.windows.end())
        partners[tid] = thread_segments(pw->second, e.until_ns);
  const auto& kernels = e.kernels;

  // The steps seen whole: none that overlaps a span whose launches went unobserved.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (size_t i = 0, u = 0; i + 1 < starts.size(); ++i) {
    const uint64_t s = starts[i], end = starts[i + 1];
    while (u < e.unobserved.size() && e.unobserved[u].second <= s) ++u;
    if (u < e.unobserved.size() && e.unobserved[u].first < end) continue;
    spans.emplace_back(s, end);
  }
  // The spans themselves: the host's side and the GPU's are seen there whole, the launches and
  // copies not. Cut into pieces of about a step (the median of those seen whole), each stands for
  // the steps it held, its calls at the rate of the steps seen (below).
  std::vector<std::pair<uint64_t, uint64_t>> dark;
  if (!e.unobserved.empty() && !spans.empty() && !segments.empty()) {
    std::vector<double> lens;
    for (const auto& [s, end] : spans) lens.push_back(double(end - s));
    std::nth_element(lens.begin(), lens.begin() + lens.size() / 2, lens.end());
    const uint64_t piece = std::clamp(uint64_t(lens[lens.size() / 2]), kMinDarkPieceNs, kMaxDarkPieceNs);
    const uint64_t lo = segments.front().w.start_ns, hi = std::min(e.until_ns, segments.back().w.end_ns);
    for (const auto& [a, z] : e.unobserved)
      for (uint64_t t = std::max(a, lo); t + piece / 2 < std::min(z, hi); t += piece)
        dark.emplace_back(t, std::min({t + piece, z, hi}));
  }
  // Whole steps and dark pieces, in time order: the loop below reads each source once.
  std::vector<std::pair<uint64_t, uint64_t>> measured;
  std::vector<bool> is_dark;
  std::merge(spans.begin(), spans.end(), dark.begin(), dark.end(), std::back_inserter(measured));
  for (const auto& m : measured) is_dark.push_back(std::binary_search(dark.begin(), dark.end(), m));
  std::vector<Breakdown> per_step, per_dark;
  size_t seg = 0, call = 0, any_call = 0, kern = 0, reading = 0, proc_reading = 0, ksample = 0;
  for (size_t m = 0; m < measured.size(); ++m) {
    const auto [s, end] = measured[m];
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
      if (handoff) {
        // While it waited, the thread it handed the work to (autograd's) ran it, or was itself held
        // up: by a CPU, the GIL, I/O. The wait takes on those shares; its running stays a handoff.
        // Only its lock waits were for that thread: its reads and polls in the same window (a socket
        // its input comes through) are waits for input, whoever ended its longest wait.
        const double waited = g.lock * f;
        b.fd += g.fd * f;
        const auto pt = partners.find(g.waker_tid);
        const Composition c = pt == partners.end()
                                  ? Composition{}
                                  : composition(pt->second, std::max(g.start_ns, s), std::min(g.end_ns, end));
        double stalled = 0;
        if (c.total() > 0) {
          const double k = waited / c.total();
          b.runnable += c.runnable * k;
          b.runnable_idle += c.runnable_idle * k;
          for (const auto& [who, ns] : c.waited_for) b.waited_for[who] += ns * k;
          b.io += c.io * k;
          b.sleep += c.sleep * k;
          stalled = (c.runnable + c.io + c.sleep) * k;
          for (const auto& [pw, ns] : c.blocked) {
            // Its own waits for the feeding thread or another launching thread are the work's turns.
            if (pw->waker_pid == pid && (pw->waker_tid == p.feeding_tid || launching_threads.contains(pw->waker_tid)))
              continue;
            const double share = pw->io + pw->lock + pw->fd;
            const double lock = ns * k * pw->lock / share, fd = ns * k * pw->fd / share;
            b.lock += lock;
            b.fd += fd;
            stalled += lock + fd;
            b.woken_by[pw->waker_pid] += lock + fd + ns * k * pw->io / share;
          }
        }
        b.handoff += std::max(0.0, waited - stalled);
      } else {
        b.lock += g.lock * f;
        b.fd += g.fd * f;
      }
      b.sleep += g.sleep * f;
      b.other += g.other * f;
      b.runnable_idle += runnable_idle * f;
      b.reclaim += g.reclaim * f;
      b.net_softirq += g.net_softirq * f;
      b.sys += std::min(g.sys, g.on_cpu) * f;
      if (g.net_softirq > 0 && g.net_softirq >= kSoftirqStorm * g.on_cpu) {
        b.storm_sys += std::min(g.sys, g.on_cpu) * f;
        b.storm_softirq += g.net_softirq * f;
      }
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
      if (c.kind == cuda::CallKind::Sync) {
        b.in_sync += double(c.duration_ns);
        ++b.syncs;
        b.sync_stacks[c.stack_id] += double(c.duration_ns);
      } else if (c.launch()) {
        b.in_launch += double(c.duration_ns);
      } else if (c.kind == cuda::CallKind::Memcpy) {
        b.in_copy += double(c.duration_ns);
        b.copy_bytes += double(std::max<int64_t>(c.bytes, 0));
        if (c.pageable) {
          b.in_pageable_copy += double(c.duration_ns);
          ++b.pageable_copies;
          b.pageable_bytes += double(c.bytes);
        }
      }
    }
    // Launches by any of its threads (the backward pass's come from autograd's), and what the
    // probes added to their calls.
    while (any_call < e.calls.size() && e.calls[any_call].ts_ns < s) ++any_call;
    for (size_t j = any_call; j < e.calls.size() && e.calls[j].ts_ns < end; ++j) {
      if (e.calls[j].launch()) ++b.launches;
      b.probes += e.probe_ns_per_call;
    }
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
    // What the thread that feeds the GPU was doing when samples found it in the kernel.
    while (ksample < e.kernel_samples.size() && e.kernel_samples[ksample].ts_ns < s) ++ksample;
    for (size_t j = ksample; j < e.kernel_samples.size() && e.kernel_samples[j].ts_ns < end; ++j)
      if (const auto& k = e.kernel_samples[j]; k.tid == p.feeding_tid && !k.what.empty()) b.kernel_in[k.what] += 1;
    // NVML's readings of its GPU taken within the step.
    while (reading < e.gpu.size() && e.gpu[reading].ts_ns < s) ++reading;
    for (size_t j = reading; j < e.gpu.size() && e.gpu[j].ts_ns < end; ++j) {
      const auto& r = e.gpu[j];
      if (r.util >= 0) {
        b.gpu_util += r.util;
        ++b.gpu_util_n;
        if (r.sm_active >= 0) {
          b.sm_active += r.sm_active;
          b.sm_active_util += r.util;
          ++b.sm_active_n;
        }
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
    if (is_dark[m]) {
      per_dark.push_back(std::move(b));
      continue;
    }
    per_step.push_back(std::move(b));
    p.step_ms.push_back(double(end - s) / 1e6);
    p.step_start_ns.push_back(s);
  }
  if (per_step.empty()) return p;
  if (!per_dark.empty()) {
    // The calls a dark piece held, at the rate of the steps seen whole; its syncs were seen.
    Breakdown seen;
    for (const auto& b : per_step) seen.add(b);
    for (auto& b : per_dark) {
      const double k = b.window_ns / seen.window_ns;
      b.steps = b.window_ns / (seen.window_ns / seen.steps);
      b.launches = seen.launches * k;
      b.in_launch = seen.in_launch * k;
      b.in_copy = seen.in_copy * k;
      b.in_pageable_copy = seen.in_pageable_copy * k;
      b.pageable_copies = seen.pageable_copies * k;
      b.pageable_bytes = seen.pageable_bytes * k;
      b.copy_bytes = seen.copy_bytes * k;
      b.in_cuda = b.in_sync + (seen.in_cuda - seen.in_sync) * k;
    }
  }
  std::vector<double> sorted = p.step_ms;
  std::sort(sorted.begin(), sorted.end());
  p.p50_ms = sorted[sorted.size() / 2];
  p.p90_ms = sorted[std::min(sorted.size() - 1, sorted.size() * 9 / 10)];
  uint64_t slow_from = 0, slow_to = 0;
  double all_ms = 0, slow_excess_ms = 0;
  size_t slow_run = 0;  // slow steps in a row, up to the last
  double slow_run_ms = 0;
  for (size_t i = 0; i < per_step.size(); ++i) {
    p.all.add(per_step[i]);
    all_ms += p.step_ms[i];
    slow_run = p.step_ms[i] > kSlowStep * p.p50_ms ? slow_run + 1 : 0;
    slow_run_ms = slow_run ? slow_run_ms + p.step_ms[i] : 0;
    if (p.step_ms[i] > kSlowStep * p.p50_ms) {
      ++p.slow_steps;
      p.slow.add(per_step[i]);
      slow_excess_ms += p.step_ms[i] - p.p50_ms;
      if (!slow_from) slow_from = spans[i].first;
      slow_to = spans[i].second;
    }
  }
  // Ranked among themselves, the slow steps stand for what slows the job now only when they weigh:
  // their time over the median is a share of the steps' worth a finding, over a quarter of a second
  // or more (a cause that has gone on a while), or the last steps seen are slow in a row for a
  // tenth of a second (its onset). A healthy job's few slow steps here and there (a kernel
  // worker's turn on its CPU), or one hiccup of 50 ms (8 of 37 steps, all in 70 ms, on the H100),
  // explain nothing about it.
  const bool onset = slow_run >= kOnsetSteps && slow_run_ms >= kOnsetMs;
  const bool slow_steps_weigh = slow_ranking == SlowSteps::RankedOverAll || onset ||
                                (all_ms > 0 && slow_excess_ms / all_ms >= kMinShare &&
                                 slow_to - slow_from >= kMinSlowSpanNs);
  for (const auto& b : per_dark) p.all.add(b);
  const uint64_t first = measured.front().first, last = measured.back().second;
  p.all.host_pressure = pressure_between(e.host_pressure, first, last);
  p.all.cgroup_pressure = pressure_between(e.cgroup_pressure, first, last);
  if (p.slow_steps) {
    p.slow.host_pressure = pressure_between(e.host_pressure, slow_from, slow_to);
    p.slow.cgroup_pressure = pressure_between(e.cgroup_pressure, slow_from, slow_to);
  }
  auto since_origin = [&](uint64_t t) { return t - std::min(t, origin_ns); };
  const uint64_t from = since_origin(first), to = since_origin(last);
  findings_from(p.all, names, e, from, to, telemetry, p.findings, {});
  // Causes of the slow steps alone (a hog that came for a while), in their window (see SlowSteps).
  if (p.slow_steps >= 2 && slow_steps_weigh && p.all.window_ns > 0) {
    std::set<std::string> have;
    for (const auto& f : p.findings) have.insert(f.cause);
    // Ranked among themselves, the GPU idle while the host ran its own code is one cause, told as
    // launch_bound or host_compute by the host time a launch takes: slow steps of a launch-bound
    // job are not a second cause, above the first, for taking a little longer per launch.
    const bool host_work_found = have.contains("launch_bound") || have.contains("host_compute");
    if (slow_ranking == SlowSteps::RankedAmongThemselves && host_work_found)
      have.insert({"launch_bound", "host_compute"});
    std::vector<Finding> slow;
    findings_from(p.slow, names, e, since_origin(slow_from), since_origin(slow_to), telemetry, slow, have);
    const double weight = p.slow.window_ns / p.all.window_ns;
    const double all_step_ms = p.all.window_ns / p.all.steps / 1e6;
    for (auto& f : slow) {
      if (slow_ranking == SlowSteps::RankedOverAll) {
        f.evidence = fmt::format("in the {} slow steps ({} of the time), {} of their time: {}", p.slow_steps,
                                 pct(weight), pct(f.share), f.evidence);
        f.share *= weight;
        f.ms_per_step = f.share * all_step_ms;
      }
      p.findings.push_back(std::move(f));
    }
  }
  // Another tenant's load on the PCIe link, by what it did to the steps: with the GPU busy, the
  // idle time findings_from weighs it by holds none of the loss (contention.h).
  if (!p.all.gpu_tenants.empty()) {
    std::vector<double> copied;
    for (const auto& b : per_step) copied.push_back(b.copy_bytes);
    if (const auto c = compare_pcie_load(spans, copied, e.gpu, e.gpu_processes, family)) {
      Finding f = pcie_comparison_finding(*c, p.all.gpu_tenants, names, origin_ns);
      const auto had = std::find_if(p.findings.begin(), p.findings.end(),
                                    [](const Finding& g) { return g.cause == "pcie_contention"; });
      if (had == p.findings.end())
        p.findings.push_back(std::move(f));
      else if (had->share < f.share)
        *had = std::move(f);
    }
  }
  // Until its exit, where the record has it (the report that ended it counts).
  const uint64_t until = e.until_ns > last ? e.until_ns : UINT64_MAX;
  const auto xid = xid_finding(e.xids, first, last, until, origin_ns);
  if (xid) p.findings.push_back(xid->finding);
  std::stable_sort(p.findings.begin(), p.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.share > b.share; });
  if (xid && xid->fatal)  // a GPU that failed comes before any slowness
    std::stable_partition(p.findings.begin(), p.findings.end(), [](const Finding& f) { return f.cause == "gpu_error"; });
  // Causes of a few slow steps that explain little of the whole come after the answer that no
  // cause explains much.
  if (std::none_of(p.findings.begin(), p.findings.end(), [](const Finding& f) { return f.share >= kMinShare; })) {
    const double busy = p.all.busy_share();
    p.findings.insert(p.findings.begin(), Finding{
        "none", "No problem found", 0, 0, from, to,
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

}  // namespace gpuscope::diagnose
