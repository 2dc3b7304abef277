// What diagnose() reads from a record: per process that drives a GPU, its calls, its threads'
// windows, kernel times, NVML's readings of its GPU and the pressure readings; then analyze().
#include "diagnose/analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>

#include "common/model.h"
#include "cuda/functions.h"
#include "diagnose/kernel_activity.h"
#include "diagnose/stragglers.h"
#include "report/call_sites.h"

namespace gpuscope::diagnose {

namespace {

// A function's kind as the record's functions table names it.
cuda::CallKind call_kind(const std::string& name) {
  for (auto k : {cuda::CallKind::Launch, cuda::CallKind::GraphLaunch, cuda::CallKind::Memcpy, cuda::CallKind::Memset,
                 cuda::CallKind::Sync, cuda::CallKind::Alloc, cuda::CallKind::Free})
    if (cuda::to_string(k) == name) return k;
  return cuda::CallKind::KernelLookup;  // none that diagnose looks at
}

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
  // GPM's SM activity: in records made since it was added.
  const bool gpm = db.has_column("gpu_samples", "sm_active");
  auto q = db.prepare(fmt::format(
      "SELECT ts_ns, gpu_util, sm_clock_mhz, throttle_reasons, pcie_tx_kbs, pcie_rx_kbs, {} FROM gpu_samples WHERE "
      "gpu = ?1 ORDER BY ts_ns",
      gpm ? "sm_active" : "NULL"));
  q.bind(1, int64_t(gpu));
  while (q.step()) {
    GpuReading r;
    r.ts_ns = uint64_t(q.i64(0));
    if (!q.is_null(1)) r.util = double(q.i64(1)) / 100;
    if (!q.is_null(2)) r.sm_clock_mhz = double(q.i64(2));
    if (!q.is_null(3)) r.throttle_reasons = uint64_t(q.i64(3));
    if (!q.is_null(4) && !q.is_null(5)) r.pcie_bytes_per_s = double(q.i64(4) + q.i64(5)) * 1024;
    if (!q.is_null(6)) r.sm_active = q.f64(6) / 100;
    e.gpu.push_back(r);
  }
  if (db.has_table("gpu_events")) {
    auto x = db.prepare("SELECT ts_ns, value FROM gpu_events WHERE gpu = ?1 AND kind = 'xid' ORDER BY ts_ns");
    x.bind(1, int64_t(gpu));
    while (x.step()) e.xids.push_back({uint64_t(x.i64(0)), x.is_null(1) ? 0u : uint32_t(x.i64(1))});
  }
  if (!db.has_table("gpu_process_samples")) return;
  auto p = db.prepare("SELECT ts_ns, pid, sm_util FROM gpu_process_samples WHERE gpu = ?1 ORDER BY ts_ns, pid");
  p.bind(1, int64_t(gpu));
  while (p.step())
    e.gpu_processes.push_back({uint64_t(p.i64(0)), uint32_t(p.i64(1)), p.is_null(2) ? -1 : double(p.i64(2)) / 100});
}

// The process's CPU samples taken in the kernel, each with what its kernel stack says it was
// doing there (kernel_activity.h); each stack is read once.
void read_kernel_samples(store::Db& db, uint32_t pid, ProcessEvidence& e) {
  if (!db.has_table("samples") || !db.has_column("samples", "kernel_stack_id")) return;
  std::map<int64_t, std::string> what_of;
  auto frames = db.prepare(
      "SELECT coalesce(y.name, '') FROM stack_frames f LEFT JOIN symbols y ON y.module_id = f.module_id AND "
      "y.offset = f.offset WHERE f.stack_id = ?1 ORDER BY f.depth");
  auto q = db.prepare(
      "SELECT ts_ns, tid, kernel_stack_id FROM samples WHERE pid = ?1 AND kernel_stack_id > 0 ORDER BY ts_ns");
  q.bind(1, int64_t(pid));
  while (q.step()) {
    const int64_t stack = q.i64(2);
    auto it = what_of.find(stack);
    if (it == what_of.end()) {
      std::vector<std::string> names;
      frames.reset();
      frames.bind(1, stack);
      while (frames.step()) names.push_back(frames.str(0));
      it = what_of.emplace(stack, kernel_activity(names)).first;
    }
    e.kernel_samples.push_back({uint64_t(q.i64(0)), uint32_t(q.i64(1)), it->second});
  }
}

}  // namespace

Diagnosis diagnose(store::RecordReader& rec, report::CallSites* sites, const DiagnoseOptions& opts) {
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
  names.observer = uint32_t(rec.meta_i64("recorder_pid", 0));
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
      if (db.has_column("thread_times", "waited_for_kthread")) {
        auto k = db.prepare("SELECT DISTINCT waited_for_pid FROM thread_times WHERE waited_for_kthread = 1");
        while (k.step()) names.kernel_threads.insert(uint32_t(k.i64(0)));
      }
    }
  }

  // The processes that drive a GPU: those that launched kernels, copied or set memory, busiest first.
  std::vector<uint32_t> procs;
  {
    auto q = db.prepare(
        "SELECT c.pid, count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE c.parent_id IS NULL AND "
        "f.kind IN ('launch', 'graph_launch', 'memcpy', 'memset') GROUP BY c.pid ORDER BY 2 DESC LIMIT 8");
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
        e.calls.push_back({uint64_t(q.i64(0)), uint64_t(q.i64(1)), uint32_t(q.i64(8)), call_kind(q.str(2)),
                           q.str(3) == to_string(gpuscope::HostMem::Pageable), q.i64(4),
                           std::hash<std::string>{}(fmt::format("{}:{}:{}", q.i64(5), q.i64(6), q.str(7))),
                           q.str(7) == cuda::to_string(cuda::CopyDir::HostToDevice), q.i64(9)});
    }
    if (d.host_telemetry) {
      // reclaim_ns came after the table: older records go without.
      const bool has_reclaim = db.has_column("thread_times", "reclaim_ns");
      const bool has_softirq = db.has_column("thread_times", "net_softirq_ns");
      const bool has_blocked_on = db.has_column("thread_times", "blocked_on");
      const bool has_sys = db.has_column("thread_times", "sys_ns");
      auto q = db.prepare(std::string(
          "SELECT tid, start_ns, end_ns, on_cpu_ns, runnable_ns, io_ns, lock_ns, fd_ns, sleep_ns, other_ns, ") +
          (has_reclaim ? "coalesce(reclaim_ns, 0)" : "0") + ", waited_ns, coalesce(waited_for_tid, 0), coalesce(waited_for_pid, 0), "
          "coalesce(waker_tid, 0), coalesce(waker_pid, 0), state, " +
          (has_softirq ? "coalesce(net_softirq_ns, 0)" : "0") + ", " +
          (has_blocked_on ? "coalesce(blocked_syscall, ''), coalesce(blocked_on, '')" : "'', ''") + ", " +
          (has_sys ? "coalesce(sys_ns, 0)" : "0") + " FROM thread_times WHERE pid = ?1 ORDER BY tid, start_ns");
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
        w.sys = double(q.i64(20));
        e.windows[uint32_t(q.i64(0))].push_back(std::move(w));
      }
    }
    read_kernel_samples(db, pid, e);
    if (d.gpu_times) {
      auto q = db.prepare(
          "SELECT a.start_ns, a.end_ns, coalesce(c.ts_ns, 0) FROM gpu_activities a LEFT JOIN calls c ON c.id = "
          "a.call_id WHERE a.pid = ?1 AND a.kind = 'kernel' ORDER BY a.start_ns");
      q.bind(1, int64_t(pid));
      while (q.step()) e.kernels.push_back({uint64_t(q.i64(0)), uint64_t(q.i64(1)), uint64_t(q.i64(2))});
    }
    if (const auto gpu = process_gpu(db, pid, names)) read_nvml(db, *gpu, e);
    if (db.has_table("pressure")) {
      // refault_file came after the table: older records go without.
      auto q = db.prepare(std::string(
          "SELECT ts_ns, pid, coalesce(cgroup, ''), cpu_some_us, memory_some_us, memory_full_us, io_some_us, "
          "io_full_us, periods, throttled_periods, throttled_us, ") +
          (db.has_column("pressure", "refault_file") ? "refault_file" : "NULL") + ", " +
          (db.has_column("pressure", "tcp_out_segs") ? "tcp_out_segs, tcp_retrans_segs" : "NULL, NULL") +
          " FROM pressure WHERE pid IN (0, ?1) ORDER BY ts_ns");
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
        r.refault_file = opt(11);
        r.tcp_out_segs = opt(12);
        r.tcp_retrans_segs = opt(13);
        (r.pid ? e.cgroup_pressure : e.host_pressure).push_back(std::move(r));
      }
    }
    e.site = [&sites](int64_t stack_id) { return sites ? sites->python_or_caller(stack_id) : std::string(); };
    if (opts.from_ns || opts.to_ns) {
      const uint64_t from = d.origin_ns + opts.from_ns, to = opts.to_ns ? d.origin_ns + opts.to_ns : UINT64_MAX;
      std::erase_if(e.calls, [&](const CudaCall& c) { return c.ts_ns < from || c.ts_ns >= to; });
      e.until_ns = std::min(e.until_ns, to);
    }
    if (opts.duty < 1 && opts.cycle_ns) {
      const uint64_t start = d.origin_ns + opts.from_ns, on_ns = uint64_t(opts.duty * double(opts.cycle_ns));
      std::erase_if(e.calls, [&](const CudaCall& c) {
        return c.gpu_work() && c.ts_ns >= start && (c.ts_ns - start) % opts.cycle_ns >= on_ns;
      });
      for (uint64_t t = start; t < e.until_ns; t += opts.cycle_ns)
        e.unobserved.emplace_back(t + on_ns, t + opts.cycle_ns);
    }
    ProcessDiagnosis p = analyze(e, names, d.host_telemetry, d.origin_ns, opts.slow_ranking);
    if (!p.step_ms.empty()) d.processes.push_back(std::move(p));
  }
  // Ranks of one NCCL communicator in this record: one that the others wait for.
  add_straggler_findings(read_rank_skew(rec), names, d.origin_ns, d.processes);
  if (procs.empty()) d.notes.push_back("no process in this record launched a kernel, copied or set memory: nothing to diagnose");
  return d;
}

}  // namespace gpuscope::diagnose
