#include "report/timeline.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "diagnose/analysis.h"
#include "report/frame_names.h"
#include "report/nccl_collectives.h"
#include "report/stack_view.h"
#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

using store::Db;

void escape_into(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  out += '"';
}

// Text from a record is cut to `limit` bytes (at a UTF-8 character's start), saying how much was
// left out: it is repeated in every event that names it (a crafted 1 MB kernel name made an
// 800 MB timeline). Names get 1 KiB; stacks and other arguments 16 KiB.
constexpr size_t kMaxName = 1024, kMaxText = 16384;

std::string quoted(std::string_view s, size_t limit = kMaxText) {
  std::string out;
  if (s.size() <= limit) {
    escape_into(out, s);
    return out;
  }
  size_t keep = limit;
  while (keep > 0 && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80) --keep;
  escape_into(out, fmt::format("{}… ({} bytes)", s.substr(0, keep), s.size()));
  return out;
}

// The diagnosis's tracks in each process: thread ids no thread has (pids end at 2^22).
constexpr int64_t kStepsTid = 999'999'990, kFindingsTid = 999'999'991;
// A process's NCCL communicators: one track each, from this tid on, in the order first called.
constexpr int64_t kCommTidBase = 999'999'000;
// NVML's tracks are processes of their own, numbered past any real pid.
constexpr int64_t kGpuPidBase = 1'000'000'000;

class Writer {
 public:
  explicit Writer(std::ostream& out) : out_(out) { put("{\"traceEvents\":[\n"); }
  void event(const std::string& json) {
    if (stats_.events++) put(",\n");
    put(json);
  }
  TimelineStats finish(const std::string& metadata) {
    put("\n],\"displayTimeUnit\":\"ns\",\"metadata\":" + metadata + "}\n");
    out_.flush();
    return stats_;
  }

 private:
  void put(const std::string& s) {
    out_.write(s.data(), static_cast<std::streamsize>(s.size()));
    stats_.bytes += s.size();
  }
  std::ostream& out_;
  TimelineStats stats_;
};

// Short stacks for events' arguments, innermost first, each stack named once: the frames the
// default flame graph view shows (stack_view.h), the innermost kDepth of them.
class FrameNames {
 public:
  FrameNames(Db& db, symbolize::Symbolizer& sym) : names_(db, sym, false) {}

  const std::vector<std::string>& operator()(int64_t stack_id) {
    auto [it, added] = cache_.try_emplace(stack_id);
    if (!added || stack_id == 0) return it->second;
    const auto& frames = names_(stack_id);
    std::vector<const NamedFrame*> root_first;
    for (auto f = frames.rbegin(); f != frames.rend(); ++f) root_first.push_back(&*f);
    const auto shown = view_stack(root_first, NativeView::Auto, false);
    for (auto f = shown.rbegin(); f != shown.rend() && it->second.size() < kDepth; ++f)
      it->second.push_back(f->label);
    return it->second;
  }

  // The first Python frame, which says which line of the program made the call; "" if none.
  std::string python_line(int64_t stack_id) {
    for (const auto& f : names_(stack_id))
      if (f.kind == NamedFrame::Kind::Python) return f.function;
    return {};
  }

 private:
  static constexpr size_t kDepth = 12;  // frames kept in an event's arguments
  FrameNamer names_;
  std::unordered_map<int64_t, std::vector<std::string>> cache_;
};

std::string stack_text(const std::vector<std::string>& frames) {
  std::string s;
  for (const auto& f : frames) s += (s.empty() ? "" : " ← ") + f;
  return s;
}

}  // namespace

TimelineStats write_timeline(store::RecordReader& rec, symbolize::Symbolizer& sym, const TimelineOptions& opt,
                             std::ostream& out) {
  Db& db = rec.db();
  int64_t origin = rec.meta_i64("start_ns", 0);
  if (!origin) {
    auto q = db.prepare("SELECT min(ts_ns) FROM calls");
    if (q.step()) origin = q.i64(0);
  }
  const int64_t lo = origin + int64_t(std::llround(opt.from_s * 1e9));
  const int64_t hi = opt.to_s > 0 ? origin + int64_t(std::llround(opt.to_s * 1e9)) : INT64_MAX;
  const std::string pid_filter = opt.pid ? fmt::format(" AND pid = {}", opt.pid) : "";
  auto us = [&](int64_t ns) { return fmt::format("{:.3f}", (ns - origin) / 1e3); };

  Writer w(out);
  FrameNames names(db, sym);
  std::set<int64_t> named_gpus;
  auto name_gpu = [&](int64_t gpu, const std::string& what) {
    if (named_gpus.insert(gpu).second)
      w.event(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":{}}}}})", kGpuPidBase + gpu,
                          quoted(what)));
  };

  // Tracks: processes and threads by name.
  {
    auto q = db.prepare("SELECT pid, coalesce(comm, ''), coalesce(cmdline, '') FROM processes WHERE 1" + pid_filter);
    while (q.step())
      w.event(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":{}}}}})", q.i64(0),
                          quoted(fmt::format("{} ({})", q.str(1).empty() ? "pid" : q.str(1), q.i64(0)))));
    auto t = db.prepare("SELECT tid, pid, coalesce(comm, '') FROM threads WHERE 1" + pid_filter);
    while (t.step())
      w.event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})", t.i64(1),
                          t.i64(0), quoted(fmt::format("{} ({})", t.str(2), t.i64(0)))));
  }

  // CUDA calls: a slice from entry to return, or an instant for calls recorded at entry only
  // (launches); nested driver calls sit inside the runtime call that made them.
  {
    auto q = db.prepare(
        "SELECT c.ts_ns, coalesce(c.duration_ns, 0), c.pid, c.tid, f.name, f.kind, coalesce(c.ret, 0), c.bytes, "
        "c.dir, c.host_mem, c.stream, k.demangled, c.grid_x, c.grid_y, c.grid_z, c.block_x, c.block_y, c.block_z, "
        "coalesce(c.stack_id, 0), c.ptr, c.parent_id IS NOT NULL, " + call_copies_sql(db) +
        " FROM calls c JOIN functions f ON f.id = c.func "
        "LEFT JOIN kernels k ON k.id = c.kernel_id WHERE c.ts_ns >= ?1 AND c.ts_ns <= ?2" +
        (opt.pid ? fmt::format(" AND c.pid = {}", opt.pid) : "") + " ORDER BY c.ts_ns");
    q.bind(1, lo).bind(2, hi);
    while (q.step()) {
      const std::string func = q.str(4), kind = q.str(5);
      std::string args = fmt::format("\"function\":{}", quoted(func));
      std::string name = func;
      if (kind == "launch") {
        name = q.is_null(11) ? "[unnamed kernel]" : q.str(11);
        args += fmt::format(",\"grid\":[{},{},{}],\"block\":[{},{},{}]", q.i64(12), q.i64(13), q.i64(14), q.i64(15),
                            q.i64(16), q.i64(17));
      }
      if (!q.is_null(10)) args += fmt::format(",\"stream\":\"{:#x}\"", uint64_t(q.i64(10)));
      if (!q.is_null(7)) args += fmt::format(",\"bytes\":{}", q.i64(7));
      if (q.i64(21) > 1) args += fmt::format(",\"copies\":{}", q.i64(21));  // a batch copy
      if (!q.is_null(8)) args += ",\"direction\":" + quoted(q.str(8));
      if (!q.is_null(9) && !q.str(9).empty()) args += ",\"host_memory\":" + quoted(q.str(9));
      if (kind == "alloc" && !q.is_null(19)) args += fmt::format(",\"ptr\":\"{:#x}\"", uint64_t(q.i64(19)));
      if (q.i64(6) != 0) args += fmt::format(",\"error\":{}", q.i64(6));
      if (q.i64(20)) args += ",\"inside_runtime_call\":true";
      if (const int64_t stack = q.i64(18)) {
        if (auto py = names.python_line(stack); !py.empty()) args += ",\"python\":" + quoted(py);
        args += ",\"stack\":" + quoted(stack_text(names(stack)));
      }
      // Calls recorded at entry only (launches) are slices of no length: flow arrows to their
      // kernels start from a slice.
      w.event(fmt::format(R"({{"ph":"X","name":{},"cat":{},"ts":{},"dur":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
                          quoted(name, kMaxName), quoted(kind), us(q.i64(0)), q.i64(1) / 1e3, q.i64(2), q.i64(3),
                          args));
    }
  }

  // CPU samples: an instant on the thread's track, named by the innermost frame.
  if (db.has_table("samples")) {
    auto q = db.prepare("SELECT ts_ns, pid, tid, coalesce(stack_id, 0), coalesce(kernel_stack_id, 0) FROM samples "
                        "WHERE ts_ns >= ?1 AND ts_ns <= ?2" + pid_filter + " ORDER BY ts_ns");
    q.bind(1, lo).bind(2, hi);
    while (q.step()) {
      const auto& user = names(q.i64(3));
      const auto& kernel = names(q.i64(4));
      const std::string leaf = !kernel.empty() ? kernel.front() + " [kernel]" : !user.empty() ? user.front() : "[no stack]";
      std::string args = "\"stack\":" + quoted(stack_text(user));
      if (!kernel.empty()) args += ",\"kernel_stack\":" + quoted(stack_text(kernel));
      if (auto py = names.python_line(q.i64(3)); !py.empty()) args += ",\"python\":" + quoted(py);
      w.event(fmt::format(R"({{"ph":"i","s":"t","name":{},"cat":"cpu_sample","ts":{},"pid":{},"tid":{},"args":{{{}}}}})",
                          quoted(leaf), us(q.i64(0)), q.i64(1), q.i64(2), args));
    }
  }

  // NVML: counter tracks under one process per GPU.
  if (db.has_table("gpus")) {
    auto g = db.prepare("SELECT idx, coalesce(name, '') FROM gpus");
    while (g.step()) name_gpu(g.i64(0), fmt::format("GPU {} (NVML): {}", g.i64(0), g.str(1)));
    const bool gpm = db.has_column("gpu_samples", "sm_active");  // records since GPM was read
    auto q = db.prepare(fmt::format(
        "SELECT ts_ns, gpu, gpu_util, mem_util, mem_used, power_mw, temperature_c, sm_clock_mhz, pcie_tx_kbs, "
        "pcie_rx_kbs, {} FROM gpu_samples WHERE ts_ns >= ?1 AND ts_ns <= ?2 ORDER BY ts_ns",
        gpm ? "sm_active, sm_occupancy, tensor_active, dram_active" : "NULL, NULL, NULL, NULL"));
    q.bind(1, lo).bind(2, hi);
    while (q.step()) {
      const int64_t pid = kGpuPidBase + q.i64(1);
      auto counter = [&](const char* name, const std::string& values) {
        w.event(fmt::format(R"({{"ph":"C","name":"{}","ts":{},"pid":{},"args":{{{}}}}})", name, us(q.i64(0)), pid,
                            values));
      };
      if (!q.is_null(2)) counter("utilisation %", fmt::format("\"gpu\":{},\"memory\":{}", q.i64(2), q.i64(3)));
      if (!q.is_null(10) && !q.is_null(11) && !q.is_null(12) && !q.is_null(13))
        counter("SM activity % (GPM)",
                fmt::format("\"sm_active\":{:.1f},\"sm_occupancy\":{:.1f},\"tensor_active\":{:.1f},\"dram_active\":{:.1f}",
                            q.f64(10), q.f64(11), q.f64(12), q.f64(13)));
      if (!q.is_null(4)) counter("memory used GiB", fmt::format("\"used\":{:.3f}", q.i64(4) / double(1 << 30)));
      if (!q.is_null(5)) counter("power W", fmt::format("\"power\":{:.1f}", q.i64(5) / 1e3));
      if (!q.is_null(6)) counter("temperature C", fmt::format("\"temperature\":{}", q.i64(6)));
      if (!q.is_null(7)) counter("SM clock MHz", fmt::format("\"sm\":{}", q.i64(7)));
      if (!q.is_null(8))
        counter("PCIe MB/s", fmt::format("\"to_gpu\":{:.1f},\"from_gpu\":{:.1f}", q.i64(9) / 1e3, q.i64(8) / 1e3));
    }
  }

  // GPU times: a track per GPU stream with its kernels, copies and memsets, and an arrow from
  // each launch (or copy call) to what it ran.
  if (db.has_table("gpu_activities")) {
    std::set<std::pair<int64_t, int64_t>> streams;
    auto q = db.prepare(
        "SELECT a.id, coalesce(a.gpu, 0), coalesce(a.stream, 0), a.start_ns, a.end_ns, a.kind, a.name, a.bytes, "
        "a.copy_kind, a.grid_x, a.grid_y, a.grid_z, a.block_x, a.block_y, a.block_z, c.pid, c.tid, c.ts_ns "
        "FROM gpu_activities a LEFT JOIN calls c ON c.id = a.call_id WHERE a.start_ns >= ?1 AND a.start_ns <= ?2" +
        (opt.pid ? fmt::format(" AND a.pid = {}", opt.pid) : "") + " ORDER BY a.start_ns");
    q.bind(1, lo).bind(2, hi);
    static const char* kCopyKinds[] = {"unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
    while (q.step()) {
      const int64_t gpu_pid = kGpuPidBase + q.i64(1), stream = q.i64(2);
      name_gpu(q.i64(1), fmt::format("GPU {}", q.i64(1)));
      if (streams.insert({q.i64(1), stream}).second)
        w.event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"stream {}"}}}})",
                            gpu_pid, stream, stream));
      const std::string kind = q.str(5);
      std::string name, args = "\"kind\":" + quoted(kind);
      if (kind == "kernel") {
        name = q.is_null(6) ? "[unnamed kernel]" : q.str(6);
        args += fmt::format(",\"grid\":[{},{},{}],\"block\":[{},{},{}]", q.i64(9), q.i64(10), q.i64(11), q.i64(12),
                            q.i64(13), q.i64(14));
      } else {
        const int64_t ck = q.i64(8);
        name = kind == "memcpy" ? fmt::format("memcpy {}", ck >= 0 && ck <= 10 ? kCopyKinds[ck] : "?") : "memset";
        args += fmt::format(",\"bytes\":{}", q.i64(7));
      }
      w.event(fmt::format(R"({{"ph":"X","name":{},"cat":"gpu","ts":{},"dur":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
                          quoted(name, kMaxName), us(q.i64(3)), (q.i64(4) - q.i64(3)) / 1e3, gpu_pid, stream, args));
      if (!q.is_null(15)) {
        w.event(fmt::format(R"({{"ph":"s","id":{},"name":"launch","cat":"flow","ts":{},"pid":{},"tid":{}}})", q.i64(0),
                            us(q.i64(17)), q.i64(15), q.i64(16)));
        w.event(fmt::format(R"({{"ph":"f","bp":"e","id":{},"name":"launch","cat":"flow","ts":{},"pid":{},"tid":{}}})",
                            q.i64(0), us(q.i64(3)), gpu_pid, stream));
      }
    }
  }

  // NCCL: per process, a track per communicator with its collectives and sends/receives, each from
  // its call to its kernels' end where GPU times tie them (else the call), named by the function.
  {
    const NcclCollectives nccl = read_nccl_collectives(db, lo, hi, opt.pid);
    std::map<std::pair<int64_t, int64_t>, int64_t> tracks;  // (pid, comm) -> tid
    std::map<int64_t, int64_t> per_process;
    for (const auto& c : nccl.calls) {
      const NcclCommunicator* comm = nccl.comm_of(c);
      auto [track, fresh] = tracks.try_emplace({c.pid, c.comm}, 0);
      if (fresh) {
        track->second = kCommTidBase + per_process[c.pid]++;
        std::string name = fmt::format("NCCL communicator {:#x}", uint64_t(c.comm));
        if (comm && comm->rank >= 0) name += fmt::format(", rank {} of {}", comm->rank, comm->nranks);
        if (comm && !comm->id.empty()) name += fmt::format(" ({})", comm->id);
        w.event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})", c.pid,
                            track->second, quoted(name)));
      }
      const bool on_gpu = c.gpu_end_ns > c.gpu_start_ns;
      // A call seen at entry only is an instant where its kernels were not tied.
      const int64_t end = std::max(c.ts_ns + c.enqueue_ns, on_gpu ? c.gpu_end_ns : 0);
      std::string args = fmt::format("\"bytes\":{}", c.bytes);
      if (c.returned) args += fmt::format(",\"enqueue_us\":{:.3f}", c.enqueue_ns / 1e3);
      if (on_gpu)
        args += fmt::format(",\"gpu_start\":{},\"gpu_us\":{:.3f}", us(c.gpu_start_ns), (c.gpu_end_ns - c.gpu_start_ns) / 1e3);
      if (c.group) args += fmt::format(",\"group\":{}", *c.group);
      if (comm && !comm->id.empty()) args += ",\"communicator\":" + quoted(comm->id);
      if (c.ret != 0) args += fmt::format(",\"error\":{}", c.ret);
      w.event(fmt::format(R"({{"ph":"X","name":{},"cat":"nccl","ts":{},"dur":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
                          quoted(c.function), us(c.ts_ns), double(end - c.ts_ns) / 1e3, c.pid, track->second, args));
    }
  }

  // Diagnosis: per process, a track of its steps and one of the findings over the window each was
  // seen in (docs/diagnosis.md).
  for (const auto& p : diagnose::diagnose(rec).processes) {
    if (opt.pid && int64_t(p.pid) != opt.pid) continue;
    w.event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"steps"}}}})", p.pid,
                        kStepsTid));
    const auto& starts = p.steps.starts;
    for (size_t i = 0; i + 1 < starts.size(); ++i) {
      if (int64_t(starts[i + 1]) < lo || int64_t(starts[i]) > hi) continue;
      w.event(fmt::format(R"({{"ph":"X","name":"step {}","cat":"step","ts":{},"dur":{:.3f},"pid":{},"tid":{}}})", i + 1,
                          us(int64_t(starts[i])), double(starts[i + 1] - starts[i]) / 1e3, p.pid, kStepsTid));
    }
    w.event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"diagnosis"}}}})", p.pid,
                        kFindingsTid));
    for (const auto& f : p.findings) {
      if (f.cause == "none") continue;
      const int64_t from = origin + int64_t(f.from_ns), to = origin + int64_t(f.to_ns);
      if (to < lo || from > hi) continue;
      w.event(fmt::format(
          R"({{"ph":"X","name":{},"cat":"finding","ts":{},"dur":{:.3f},"pid":{},"tid":{},"args":{{"cause":{},"share_of_step":{:.3f},"ms_per_step":{:.3f},"evidence":{},"fix":{}}}}})",
          quoted(f.title), us(from), double(to - from) / 1e3, p.pid, kFindingsTid, quoted(f.cause), f.share,
          f.ms_per_step, quoted(f.evidence), quoted(f.fix)));
    }
  }

  return w.finish(fmt::format(R"({{"source":"gpuscope {}","command":{},"clock":"CLOCK_MONOTONIC","origin_ns":{}}})",
                              rec.meta("gpuscope_version"), quoted(rec.meta("command")), origin));
}

}  // namespace gpuscope::report
