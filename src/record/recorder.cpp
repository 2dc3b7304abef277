#include "record/recorder.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "attach/bpf_session.h"
#include "attach/preflight.h"
#include "common/error.h"
#include "common/log.h"
#include "discover/proc.h"
#include "discover/python.h"
#include "gpu/gpu_times.h"
#include "gpu/nvml.h"
#include "record/pipeline.h"
#include "store/record_writer.h"
#include "inject/gpu_trace.h"
#include "symbolize/elf_file.h"
#include "symbolize/process_maps.h"

namespace gpuscope::record {
namespace {

uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  std::getline(in, line);
  return line;
}

// Resolves a command name the way execvp will.
std::string find_in_path(const std::string& cmd) {
  if (cmd.find('/') != std::string::npos) return cmd;
  const char* path = getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + cmd;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

// Signals we take through a signalfd, blocked in every thread.
sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set, s);
  return set;
}

// Messages from the ring-buffer and pipeline threads to the control loop.
class ControlQueue {
 public:
  ControlQueue() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~ControlQueue() { close(fd_); }
  int fd() const { return fd_; }
  void push_libload(const gs_libload_record& r) {
    std::lock_guard lock(mu_);
    libloads_.push_back(r);
    wake();
  }
  void push_exec(pid_t pid) {
    std::lock_guard lock(mu_);
    execs_.push_back(pid);
    wake();
  }
  void take(std::vector<gs_libload_record>& libloads, std::vector<pid_t>& execs) {
    uint64_t v;
    [[maybe_unused]] auto n = read(fd_, &v, sizeof(v));
    std::lock_guard lock(mu_);
    libloads.swap(libloads_);
    execs.swap(execs_);
  }

 private:
  void wake() {
    uint64_t one = 1;
    [[maybe_unused]] auto n = write(fd_, &one, sizeof(one));
  }
  int fd_;
  std::mutex mu_;
  std::vector<gs_libload_record> libloads_;
  std::vector<pid_t> execs_;
};

// Processes stopped by the BPF side while we attach; continued however we leave.
class StoppedProcesses {
 public:
  void add(pid_t pid) { pids_.insert(pid); }
  void resume(pid_t pid) {
    kill(pid, SIGCONT);
    pids_.erase(pid);
  }
  ~StoppedProcesses() {
    for (pid_t p : pids_) kill(p, SIGCONT);
  }

 private:
  std::set<pid_t> pids_;
};

class Recorder {
 public:
  explicit Recorder(const RecordOptions& opts) : opts_(opts) {}
  int run();

 private:
  void attach_library(pid_t pid, const std::string& open_path, const std::string& shown_path, uint64_t ts_ns);
  void attach_mapped_libraries(pid_t pid);
  // Gives the BPF side the process's interpreter, if it runs one gpuscope can walk.
  void find_python(pid_t pid);
  std::map<std::pair<uint64_t, uint64_t>, std::optional<discover::PythonBinary>> python_binaries_;
  std::set<std::string> python_versions_said_;
  // True when the file carries a CUDA runtime of its own and was probed.
  bool check_static_runtime(pid_t pid, const std::string& exe_path, const std::string& shown);
  pid_t spawn_command();
  void handle_control();
  bool targets_alive() const;

  const RecordOptions& opts_;
  std::unique_ptr<store::RecordWriter> writer_;
  std::unique_ptr<attach::BpfSession> bpf_;
  std::unique_ptr<Pipeline> pipeline_;
  symbolize::ProcessMaps maps_;
  ControlQueue control_;
  StoppedProcesses stopped_;
  std::set<std::pair<uint64_t, uint64_t>> checked_executables_;
  // What the recording cost: gpuscope's own CPU time and peak memory, and with --bpf-stats
  // each BPF program's runs and run time (spent in the traced threads, not in gpuscope).
  void record_own_cost();
  // NVML sampling on a thread of its own; without NVML, says so once and records without it.
  void start_gpu_metrics();
  // --gpu-times: where the injection library is and writes; after the recording, its traces
  // are tied to the recorded calls and stored.
  void prepare_gpu_times();
  void store_gpu_times();
  std::string inject_library_, gpu_trace_dir_;
  std::unique_ptr<gpu::NvmlSampler> nvml_;

  int libraries_attached_ = 0;
  bool detach_runtime_launches_with_driver_ = false;
  pid_t child_ = 0;
  int go_fd_ = -1;
};

void Recorder::attach_library(pid_t pid, const std::string& open_path, const std::string& shown_path, uint64_t ts_ns) {
  auto res = bpf_->attach_file(open_path);
  if (res.already_attached) return;
  store::LibraryRow row{static_cast<uint32_t>(pid), shown_path, res.build_id, res.runtime_probes, res.driver_probes,
                        ts_ns, res.error};
  if (!res.error.empty())
    log_error("could not probe {} in PID {}: {}", shown_path, pid, res.error);
  else if (res.runtime_probes + res.driver_probes > 0)
    ++libraries_attached_;
  if (res.error.empty() && res.driver_probes > 0 && detach_runtime_launches_with_driver_ &&
      bpf_->runtime_launch_probes()) {
    // Every runtime launch that can run goes through the driver's launch functions, which are
    // probed from now on; its runtime probe would only add a second trap.
    const int n = bpf_->detach_runtime_launch_probes();
    writer_->set_meta("runtime_launch_probes_removed_at_ns", std::to_string(ts_ns));
    log_debug("driver probed: launch probes removed from {} runtime link(s); launches recorded by the driver", n);
  }
  if (!opts_.quiet && res.error.empty())
    log_info("probing {} ({} runtime, {} driver functions) first used by PID {}", shown_path, res.runtime_probes,
             res.driver_probes, pid);
  pipeline_->add_library(std::move(row));
}

void Recorder::prepare_gpu_times() {
  if (!opts_.gpu_times) return;
  if (opts_.command.empty())
    throw Error("--gpu-times works with record -- CMD; for a service, start it with CUDA_INJECTION64_PATH and {} "
                "set (docs/gpu-times.md)",
                GS_GPU_TRACE_ENV);
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string dir = n > 0 ? std::string(self, size_t(n)).substr(0, std::string(self, size_t(n)).rfind('/')) : ".";
  inject_library_ = dir + "/libgpuscope_inject.so";
  if (access(inject_library_.c_str(), R_OK) != 0)
    throw Error("--gpu-times needs {}, which this build lacks (CUPTI's headers were not found when it was built)",
                inject_library_);
  char tmpl[] = "/tmp/gpuscope-gpu-XXXXXX";
  if (!mkdtemp(tmpl)) throw Error("cannot make a directory for GPU traces: {}", strerror(errno));
  chmod(tmpl, 0777);  // the command may drop privileges
  gpu_trace_dir_ = tmpl;
}

void Recorder::store_gpu_times() {
  if (gpu_trace_dir_.empty()) return;
  uint64_t activities = 0, matched = 0, dropped = 0;
  std::vector<std::string> files;
  std::string errors;
  if (DIR* d = opendir(gpu_trace_dir_.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string_view(e->d_name).starts_with("gpu-")) files.push_back(gpu_trace_dir_ + "/" + e->d_name);
    closedir(d);
  }
  try {
    store::Db db(opts_.output, store::Db::Mode::Create);
    db.exec("BEGIN");
    auto calls_of = db.prepare(
        "SELECT c.id, c.tid, c.ts_ns, coalesce(c.duration_ns, 0), f.kind FROM calls c JOIN functions f ON f.id = c.func "
        "WHERE c.pid = ?1 ORDER BY c.ts_ns");
    auto insert = db.prepare(
        "INSERT INTO gpu_activities(pid, kind, gpu, stream, start_ns, end_ns, bytes, copy_kind, name, call_id, "
        "grid_x, grid_y, grid_z, block_x, block_y, block_z) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)");
    for (const auto& f : files) {
      gpu::GpuTrace t;
      try {
        t = gpu::read_gpu_trace(f);
      } catch (const std::exception& e) {
        errors += std::string(errors.empty() ? "" : "; ") + e.what();
        continue;
      }
      dropped += t.dropped;
      std::vector<gpu::RecordedCall> calls;
      calls_of.bind(1, int64_t(t.header.pid));
      while (calls_of.step())
        calls.push_back({calls_of.i64(0), uint32_t(calls_of.i64(1)), uint64_t(calls_of.i64(2)),
                         uint64_t(calls_of.i64(3)), calls_of.str(4)});
      calls_of.reset();
      const auto ids = gpu::correlate(t, calls);
      for (size_t i = 0; i < t.records.size(); ++i) {
        const auto& r = t.records[i];
        if (r.kind == GS_GPU_API) continue;
        const char* kind = r.kind == GS_GPU_KERNEL ? "kernel" : r.kind == GS_GPU_MEMCPY ? "memcpy" : "memset";
        insert.bind(1, int64_t(t.header.pid)).bind(2, std::string_view(kind)).bind(3, r.device).bind(4, r.stream);
        insert.bind(5, r.start).bind(6, r.end);
        if (r.kind != GS_GPU_KERNEL) insert.bind(7, r.bytes);
        if (r.kind == GS_GPU_MEMCPY) insert.bind(8, uint32_t(r.detail));
        if (!t.names[i].empty()) insert.bind(9, std::string_view(symbolize::demangle(t.names[i])));
        if (ids[i]) insert.bind(10, ids[i]);
        if (r.kind == GS_GPU_KERNEL)
          for (int k = 0; k < 3; ++k) insert.bind(11 + k, r.grid[k]).bind(14 + k, r.block[k]);
        insert.run();
        ++activities;
        matched += ids[i] != 0;
      }
      unlink(f.c_str());
    }
    auto meta = db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)");
    const std::string summary =
        files.empty() ? "none: no process wrote GPU times (no CUDA driver loaded gpuscope's library into it, or the library said why above)"
                      : fmt::format("cupti: {} activities from {} process(es), {} tied to their calls, {} dropped{}",
                                    activities, files.size(), matched, dropped, errors.empty() ? "" : "; " + errors);
    meta.bind(1, std::string_view("gpu_times")).bind(2, summary).run();
    db.exec("COMMIT");
    if (!opts_.quiet) log_info("GPU times: {}", summary);
  } catch (const std::exception& e) {
    log_error("could not store GPU times: {}", e.what());
  }
  rmdir(gpu_trace_dir_.c_str());
}

void Recorder::start_gpu_metrics() {
  const double hz = opts_.gpu_sample_hz < 0 ? kDefaultGpuSampleHz : opts_.gpu_sample_hz;
  if (hz == 0) {
    writer_->set_meta("gpu_metrics", "off (--gpu-sample-hz 0)");
    return;
  }
  nvml_ = std::make_unique<gpu::NvmlSampler>();
  if (!nvml_->available()) {
    if (!opts_.quiet) log_info("GPU metrics are off: {}", nvml_->error());
    writer_->set_meta("gpu_metrics", "off: " + nvml_->error());
    nvml_.reset();
    return;
  }
  for (const auto& d : nvml_->devices()) writer_->add_gpu(d);
  writer_->set_meta("gpu_metrics", fmt::format("nvml, driver {}", nvml_->driver_version()));
  writer_->set_meta("gpu_sample_hz", fmt::format("{}", hz));
  nvml_->start(hz, [this](gpu::NvmlSampler::Batch&& b) { pipeline_->add_gpu_batch(std::move(b)); });
}

void Recorder::record_own_cost() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto ns = [](const timeval& tv) { return static_cast<uint64_t>(tv.tv_sec) * 1'000'000'000 + tv.tv_usec * 1000ull; };
  writer_->set_meta("recorder_cpu_ns", std::to_string(ns(ru.ru_utime) + ns(ru.ru_stime)));
  writer_->set_meta("recorder_max_rss_kb", std::to_string(ru.ru_maxrss));
  if (!opts_.bpf_stats) return;
  nlohmann::json progs = nlohmann::json::object();
  for (const auto& p : bpf_->program_stats())
    if (p.runs) progs[p.name] = {{"runs", p.runs}, {"run_time_ns", p.run_time_ns}};
  writer_->set_meta("bpf_program_stats", progs.dump());
}

bool Recorder::check_static_runtime(pid_t pid, const std::string& exe_path, const std::string& shown) {
  struct stat st{};
  if (stat(exe_path.c_str(), &st) != 0 || !checked_executables_.insert({st.st_dev, st.st_ino}).second) return false;
  if (discover::is_cuda_runtime_library(shown) || discover::is_cuda_driver_library(shown)) return false;
  // A file that is not ELF (a script) defines nothing.
  if (!symbolize::defines_any_function(exe_path, {"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMalloc"}))
    return false;
  attach_library(pid, exe_path, shown + " (static CUDA runtime)", clock_ns(CLOCK_MONOTONIC));
  return true;
}

void Recorder::find_python(pid_t pid) {
  if (!opts_.python_stacks) return;
  auto inspect = [&](const discover::Mapping& m) {
    const std::pair key{(uint64_t(m.dev_major) << 20) | m.dev_minor, m.inode};
    auto it = python_binaries_.find(key);
    if (it == python_binaries_.end())
      it = python_binaries_.emplace(key, discover::inspect_python_binary(discover::path_in_target(pid, m.path), m.path))
               .first;
    return it->second;
  };
  auto py = discover::find_python(discover::read_maps(pid), inspect);
  if (!py) return;
  const auto& b = py->binary;
  const std::string version = fmt::format("{}.{}.{}", b.major, b.minor, b.micro);
  if (!b.layout) {
    if (python_versions_said_.insert(version).second)
      log_warn("PID {} runs Python {}, whose frames gpuscope cannot walk (it knows {}); its stacks stay native", pid,
               version, discover::supported_python_versions());
    return;
  }
  gs_py_process proc{py->runtime_addr, b.layout->bpf};
  if (!bpf_->set_python_process(pid, proc)) {
    log_warn("too many Python processes: PID {}'s stacks stay native", pid);
    return;
  }
  pipeline_->add_python_process(pid, *py);
  if (python_versions_said_.insert(version).second && !opts_.quiet)
    log_info("PID {} runs Python {} ({}): its stacks show Python functions and lines", pid, version, b.path);
  else
    log_debug("PID {} runs Python {} ({})", pid, version, b.path);
}

void Recorder::attach_mapped_libraries(pid_t pid) {
  std::set<std::string> seen;
  bool has_cuda = false;
  for (const auto& m : discover::read_maps(pid)) {
    if (m.path.empty() || !seen.insert(m.path).second) continue;
    if (discover::is_cuda_runtime_library(m.path) || discover::is_cuda_driver_library(m.path)) {
      has_cuda = true;
      attach_library(pid, discover::path_in_target(pid, m.path), m.path, clock_ns(CLOCK_MONOTONIC));
    }
  }
  if (has_cuda || !opts_.all) check_static_runtime(pid, "/proc/" + std::to_string(pid) + "/exe", discover::read_exe(pid));
  if (!has_cuda && !opts_.all && !opts_.quiet)
    log_info("PID {} has no CUDA library loaded yet; its probes attach when it loads one", pid);
  maps_.refresh(pid);
  find_python(pid);
}

pid_t Recorder::spawn_command() {
  int go[2], err[2];
  if (pipe2(go, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) throw Error("pipe: {}", strerror(errno));
  std::vector<char*> argv;
  for (const auto& a : opts_.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The command's environment, made here: after fork only async-signal-safe calls are allowed.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (!gpu_trace_dir_.empty() && (v.starts_with("CUDA_INJECTION64_PATH=") || v.starts_with(GS_GPU_TRACE_ENV "=")))
      continue;
    env_strings.emplace_back(*e);
  }
  if (!gpu_trace_dir_.empty()) {
    env_strings.push_back("CUDA_INJECTION64_PATH=" + inject_library_);
    env_strings.push_back(std::string(GS_GPU_TRACE_ENV "=") + gpu_trace_dir_);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) throw Error("fork: {}", strerror(errno));
  if (pid == 0) {
    // Wait until the parent has made us a target, so that no CUDA call of ours is missed.
    close(go[1]);
    close(err[0]);
    char c;
    if (read(go[0], &c, 1) != 1) _exit(127);
    sigset_t all = handled_signals();
    sigprocmask(SIG_UNBLOCK, &all, nullptr);
    execvpe(argv[0], argv.data(), envp.data());
    int e = errno;
    [[maybe_unused]] auto n = write(err[1], &e, sizeof(e));
    _exit(127);
  }
  close(go[0]);
  close(err[1]);
  bpf_->add_target(pid);
  if (std::string exe = find_in_path(opts_.command[0]); !exe.empty()) check_static_runtime(pid, exe, exe);
  [[maybe_unused]] auto n = write(go[1], "g", 1);
  close(go[1]);
  int child_errno = 0;
  if (read(err[0], &child_errno, sizeof(child_errno)) == sizeof(child_errno)) {
    close(err[0]);
    waitpid(pid, nullptr, 0);
    throw Error("cannot run '{}': {}", opts_.command[0], strerror(child_errno));
  }
  close(err[0]);
  return pid;
}

void Recorder::handle_control() {
  std::vector<gs_libload_record> libloads;
  std::vector<pid_t> execs;
  control_.take(libloads, execs);
  for (const auto& l : libloads) {
    const pid_t pid = static_cast<pid_t>(l.pid);
    if (l.stopped) stopped_.add(pid);
    const std::string path(l.path, strnlen(l.path, sizeof(l.path)));
    const std::string open_path = discover::path_in_target(pid, path);
    const bool probed = l.cuda_name ? (attach_library(pid, open_path, path, l.ts_ns), true)
                                    : check_static_runtime(pid, open_path, path);
    // The library is mapped now: name its frames even if the process dies soon. A process
    // stopped here is snapshotted in any case: the C library, mapped after the CUDA runtime,
    // is often in only this snapshot of a short-lived process.
    if (probed || l.stopped) maps_.refresh(pid);
    // A libpython is found at its load, before its first Python frame runs.
    if (discover::looks_like_python(path)) find_python(pid);
    bpf_->mark_checked(l.dev, l.ino);
    if (l.stopped) stopped_.resume(pid);
  }
  for (pid_t pid : execs) {
    check_static_runtime(pid, "/proc/" + std::to_string(pid) + "/exe", discover::read_exe(pid));
    find_python(pid);
  }
}

bool Recorder::targets_alive() const {
  for (pid_t p : opts_.pids)
    if (discover::process_exists(p)) return true;
  return false;
}

int Recorder::run() {
  attach::check_can_trace();
  prepare_gpu_times();
  // Every thread inherits this mask; signals arrive through the signalfd only.
  sigset_t sigs = handled_signals();
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  const int sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
  writer_ = std::make_unique<store::RecordWriter>(opts_.output);

  utsname u{};
  uname(&u);
  const std::string mode = opts_.all ? "all" : !opts_.pids.empty() ? "pid" : "command";
  std::string what = join(opts_.command);
  for (pid_t p : opts_.pids) what += (what.empty() ? "" : " ") + std::to_string(p);
  writer_->set_meta("gpuscope_version", GPUSCOPE_VERSION);
  writer_->set_meta("host", u.nodename);
  writer_->set_meta("kernel", u.release);
  writer_->set_meta("mode", mode);
  writer_->set_meta("command", what);
  writer_->set_meta("clock", "CLOCK_MONOTONIC");
  writer_->set_meta("realtime_offset_ns", std::to_string(clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC)));
  writer_->set_meta("cuda_driver_version", driver_version());
  writer_->set_meta("stacks", opts_.stacks ? "1" : "0");

  attach::SessionConfig cfg;
  // Kernels loaded before gpuscope started are named only by their runtime registration, so
  // the runtime's launch probes stay where processes are joined late.
  const bool whole_history = opts_.pids.empty() && !opts_.all;
  cfg.runtime_launch_probes = opts_.launch_probes != LaunchProbes::Driver;
  detach_runtime_launches_with_driver_ = opts_.launch_probes == LaunchProbes::Auto && whole_history;
  writer_->set_meta("launch_probes", opts_.launch_probes == LaunchProbes::Driver ? "driver"
                                     : detach_runtime_launches_with_driver_     ? "driver once probed"
                                                                                 : "runtime and driver");
  cfg.filter_targets = !opts_.all;
  cfg.program_stats = opts_.bpf_stats;
  cfg.sample_stack_copy = opts_.dwarf_unwind_samples;
  cfg.call_stack_copy = opts_.dwarf_unwind_calls && opts_.stacks;
  writer_->set_meta("call_unwinding", !opts_.stacks ? "none" : opts_.dwarf_unwind_calls ? "dwarf" : "frame pointers");
  cfg.capture_stacks = opts_.stacks;
  cfg.python_stacks = opts_.stacks && opts_.python_stacks;
  writer_->set_meta("python_stacks", cfg.python_stacks ? "1" : "0");
  cfg.stop_for_shared_objects = !opts_.all;
  cfg.ringbuf_bytes = opts_.ringbuf_mb << 20;
  cfg.wakeup_bytes = cfg.ringbuf_bytes / 4;
  bpf_ = std::make_unique<attach::BpfSession>(cfg);
  if (opts_.cpu_profile_hz) {
    bpf_->start_cpu_sampling(opts_.cpu_profile_hz);
    writer_->set_meta("cpu_profile_hz", std::to_string(opts_.cpu_profile_hz));
    writer_->set_meta("sample_unwinding", opts_.dwarf_unwind_samples ? "dwarf" : "frame pointers");
  }

  PipelineConfig pcfg;
  pcfg.complete_history = whole_history;
  pipeline_ = std::make_unique<Pipeline>(*writer_, *bpf_, maps_, pcfg);
  bpf_->set_handler([this](const void* data, size_t size) {
    uint16_t kind;
    std::memcpy(&kind, data, sizeof(kind));
    if (kind == GS_REC_LIBLOAD && size >= sizeof(gs_libload_record)) {
      control_.push_libload(*static_cast<const gs_libload_record*>(data));
      return;
    }
    // A new program is looked at now (static CUDA runtime, Python interpreter), not when the
    // pipeline gets to it: it may lag behind by more than the program takes to start.
    if (kind == GS_REC_EXEC && size >= sizeof(gs_proc_record))
      control_.push_exec(static_cast<pid_t>(static_cast<const gs_proc_record*>(data)->pid));
    pipeline_->push(data, size);
  });
  pipeline_->start();

  std::atomic<bool> consuming{true};
  std::thread consumer([&] {
    while (consuming.load(std::memory_order_relaxed)) {
      bpf_->poll(20);
      pipeline_->end_batch();
    }
  });
  auto stop_consumer = [&] {
    if (!consuming.exchange(false)) return;
    // No new stops from here on; those already made are in the ring buffer or the control
    // queue, and are answered below, so that no process is left stopped.
    bpf_->stop_stopping_processes();
    consumer.join();
    while (bpf_->poll(0) > 0) pipeline_->end_batch();  // drain what is left
    pipeline_->end_batch();
    handle_control();
  };

  const uint64_t start_ns = clock_ns(CLOCK_MONOTONIC);
  writer_->set_meta("start_ns", std::to_string(start_ns));
  int exit_code = 0;
  try {
    if (opts_.all) {
      for (pid_t p : discover::list_pids())
        if (p != getpid()) attach_mapped_libraries(p);
    } else if (!opts_.pids.empty()) {
      std::vector<pid_t> all = opts_.pids;
      for (pid_t d : discover::descendants(opts_.pids)) all.push_back(d);
      for (pid_t p : all) {
        bpf_->add_target(p);
        attach_mapped_libraries(p);
      }
    } else {
      child_ = spawn_command();
    }
    if (!opts_.quiet)
      log_info("recording {} into {}{}", opts_.all ? "every process" : mode == "pid" ? "PID " + what : what,
               opts_.output, opts_.duration_s > 0 ? fmt::format(" for {}s", opts_.duration_s) : "");
    // After the command has started: a command that cannot run fails with its own error alone.
    start_gpu_metrics();

    const uint64_t deadline = opts_.duration_s > 0 ? start_ns + uint64_t(opts_.duration_s * 1e9) : 0;
    bool running = true;
    while (running) {
      pollfd fds[2] = {{sfd, POLLIN, 0}, {control_.fd(), POLLIN, 0}};
      ::poll(fds, 2, 100);
      if (fds[1].revents & POLLIN) handle_control();
      signalfd_siginfo si{};
      while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGCHLD) continue;
        if (child_) {
          // Ctrl-C at the terminal reaches the command too; forward only what was sent to us alone.
          if (si.ssi_code != SI_KERNEL) kill(child_, static_cast<int>(si.ssi_signo));
        } else {
          running = false;
        }
      }
      if (child_) {
        int status = 0;
        if (waitpid(child_, &status, WNOHANG) == child_) {
          exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          child_ = 0;
          running = false;
        }
      }
      if (mode == "pid" && !targets_alive()) {
        if (!opts_.quiet) log_info("the target process exited");
        running = false;
      }
      if (deadline && clock_ns(CLOCK_MONOTONIC) >= deadline) running = false;
    }
    handle_control();
  } catch (...) {
    stop_consumer();
    if (nvml_) nvml_->stop();
    pipeline_->stop();
    writer_->set_meta("end_ns", std::to_string(clock_ns(CLOCK_MONOTONIC)));
    writer_->finish();
    throw;
  }

  stop_consumer();
  if (nvml_) nvml_->stop();
  pipeline_->stop();
  writer_->set_meta("end_ns", std::to_string(clock_ns(CLOCK_MONOTONIC)));
  record_own_cost();
  writer_->finish();
  close(sfd);
  store_gpu_times();

  const auto st = pipeline_->stats();
  const auto lost = bpf_->lost();
  uint64_t lost_total = st.queue_dropped_records;
  for (uint64_t v : lost) lost_total += v;
  if (!opts_.quiet) {
    log_info("recorded {} CUDA calls ({} kernel launches){} into {}; {} events lost", st.calls, st.launches,
             opts_.cpu_profile_hz ? fmt::format(" and {} CPU samples", st.samples) : "", opts_.output, lost_total);
    if (st.calls == 0)
      log_info("{}", libraries_attached_ == 0 ? "no CUDA library was loaded by the target: nothing to record"
                                              : "the target loaded CUDA but made no probed call");
  }

  // A command still running after --duration keeps running, unobserved; we wait for it.
  if (child_) {
    int status = 0;
    pthread_sigmask(SIG_UNBLOCK, &sigs, nullptr);
    waitpid(child_, &status, 0);
    exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return exit_code;
}

}  // namespace

int run_record(const RecordOptions& opts) {
  Recorder r(opts);
  return r.run();
}

}  // namespace gpuscope::record
