#include "record/recorder.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "attach/preflight.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "discover/proc.h"
#include "gpu/gpu_times.h"
#include "inject/gpu_trace.h"
#include "inject/heap_hooks.h"
#include "inject/launch_ring.h"
#include "store/record_writer.h"
#include "elf/elf_file.h"

namespace gpuscope::record {
namespace {

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

class Recorder {
 public:
  explicit Recorder(const RecordOptions& opts) : opts_(opts) {}
  int run();

 private:
  pid_t spawn_command();
  bool targets_alive() const;
  // What the recording cost: gpuscope's own CPU time and peak memory, and with --bpf-stats
  // each BPF program's runs and run time (spent in the traced threads, not in gpuscope).
  void record_own_cost();
  void record_peak_memory();  // once the record is finished
  // --gpu-times: where the injection library is and writes; after the recording, its traces
  // are tied to the recorded calls and stored.
  void prepare_gpu_times();
  void store_gpu_times(uint64_t start_ns, uint64_t end_ns);

  const RecordOptions& opts_;
  std::unique_ptr<store::RecordWriter> writer_;
  std::unique_ptr<Tracer> tracer_;
  // --launch-probes in-process: the library preloaded into the command, and the directory of the
  // socket its processes send their launch rings to.
  void prepare_launch_rings();
  std::string inject_library_, gpu_trace_dir_;
  std::string launches_library_, launch_ring_dir_;
  LaunchProbes launch_probes_ = LaunchProbes::Auto;  // as resolved for this recording
  pid_t child_ = 0;
};

void Recorder::prepare_gpu_times() {
  if (!opts_.gpu_trace_dir.empty()) {
    if (!opts_.command.empty())
      throw Error("--gpu-trace-dir is for --pid/--all; record -- CMD takes --gpu-times instead");
    struct stat st {};
    if (stat(opts_.gpu_trace_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw Error("--gpu-trace-dir {}: no such directory (the one a service's {} names)", opts_.gpu_trace_dir,
                  GS_GPU_TRACE_ENV);
    gpu_trace_dir_ = opts_.gpu_trace_dir;
    return;
  }
  if (!opts_.gpu_times) return;
  if (opts_.command.empty())
    throw Error("--gpu-times works with record -- CMD; for a service, start it with CUDA_INJECTION64_PATH and {} "
                "set and record it with --gpu-trace-dir (docs/gpu-times.md)",
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

void Recorder::store_gpu_times(uint64_t start_ns, uint64_t end_ns) {
  if (gpu_trace_dir_.empty()) return;
  // A service's files (--gpu-trace-dir) are its whole life's and still being written: only the
  // processes recorded, only the recording's window, and the files stay.
  const bool services = !opts_.gpu_trace_dir.empty();
  uint64_t activities = 0, matched = 0, dropped = 0;
  uint64_t launches = 0, kernels_tied = 0;  // the launches recorded, and kernels tied to one
  std::vector<std::string> files;
  std::string errors;
  try {
    store::Db db(opts_.output, store::Db::Mode::Create);
    std::set<int64_t> recorded;
    if (services) {
      auto pids = db.prepare("SELECT DISTINCT pid FROM calls");
      while (pids.step()) recorded.insert(pids.i64(0));
    }
    if (DIR* d = opendir(gpu_trace_dir_.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string_view name(e->d_name);
        if (!name.starts_with("gpu-") || !name.ends_with(".bin")) continue;
        if (services && !recorded.contains(std::strtoll(e->d_name + 4, nullptr, 10))) continue;
        files.push_back(gpu_trace_dir_ + "/" + e->d_name);
      }
      closedir(d);
    }
    // The library hands CUPTI's records over once a second: let the window's last second land.
    if (services && !files.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
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
      for (const auto& c : calls) launches += c.kind == "launch";
      const auto ids = gpu::correlate(t, calls);
      for (size_t i = 0; i < t.records.size(); ++i) {
        const auto& r = t.records[i];
        if (r.kind == GS_GPU_API) continue;
        if (services && !ids[i] && (r.end < start_ns || r.start > end_ns)) continue;
        const char* kind = r.kind == GS_GPU_KERNEL ? "kernel" : r.kind == GS_GPU_MEMCPY ? "memcpy" : "memset";
        insert.bind(1, int64_t(t.header.pid)).bind(2, std::string_view(kind)).bind(3, r.device).bind(4, r.stream);
        insert.bind(5, r.start).bind(6, r.end);
        if (r.kind != GS_GPU_KERNEL) insert.bind(7, r.bytes);
        if (r.kind == GS_GPU_MEMCPY) insert.bind(8, uint32_t(r.detail));
        if (!t.names[i].empty()) insert.bind(9, std::string_view(elf::demangle(t.names[i])));
        if (ids[i]) insert.bind(10, ids[i]);
        if (r.kind == GS_GPU_KERNEL)
          for (int k = 0; k < 3; ++k) insert.bind(11 + k, r.grid[k]).bind(14 + k, r.block[k]);
        insert.run();
        ++activities;
        matched += ids[i] != 0;
        kernels_tied += r.kind == GS_GPU_KERNEL && ids[i] != 0;
      }
      if (!services) unlink(f.c_str());
    }
    auto meta = db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)");
    // Records lost without CUPTI counting them: another CUPTI user in the process (a profiler
    // started after gpuscope's library) can take the activity buffers over.
    std::string coverage;
    if (!services && launches >= 1000 && kernels_tied * 2 < launches)
      coverage = fmt::format("; only {} of {} kernel launches have a GPU time (another CUPTI user in the process, "
                             "e.g. a profiler, may have taken CUPTI's records)",
                             kernels_tied, launches);
    std::string summary =
        files.empty() ? (services ? fmt::format("none: no recorded process has a gpu-PID.bin in {}", gpu_trace_dir_)
                                  : std::string("none: no process wrote GPU times (no CUDA driver loaded gpuscope's library into it, or the library said why above)"))
                      : fmt::format("cupti: {} activities from {} process(es), {} tied to their calls, {} dropped{}",
                                    activities, files.size(), matched, dropped, errors.empty() ? "" : "; " + errors);
    summary += coverage;
    meta.bind(1, std::string_view("gpu_times")).bind(2, summary).run();
    db.exec("COMMIT");
    if (!coverage.empty())
      log_warn("GPU times: {}", summary);
    else if (!opts_.tracer.quiet)
      log_info("GPU times: {}", summary);
  } catch (const std::exception& e) {
    log_error("could not store GPU times: {}", e.what());
  }
  if (!services) rmdir(gpu_trace_dir_.c_str());
}

void Recorder::record_own_cost() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto ns = [](const timeval& tv) { return static_cast<uint64_t>(tv.tv_sec) * 1'000'000'000 + tv.tv_usec * 1000ull; };
  writer_->set_meta("recorder_cpu_ns", std::to_string(ns(ru.ru_utime) + ns(ru.ru_stime)));
  writer_->set_meta("recorder_max_rss_kb", std::to_string(ru.ru_maxrss));
  if (!opts_.tracer.bpf_stats) return;
  nlohmann::json progs = nlohmann::json::object();
  for (const auto& p : tracer_->bpf().program_stats())
    if (p.runs) progs[p.name] = {{"runs", p.runs}, {"run_time_ns", p.run_time_ns}};
  writer_->set_meta("bpf_program_stats", progs.dump());
}

void Recorder::record_peak_memory() {
  // The peak comes while finishing (the writer's last batches, indexes, the final checkpoint)
  // and tying GPU times: taken before them it was 218 MB where 390 MB was the peak.
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  try {
    store::Db db(opts_.output, store::Db::Mode::Create);
    db.exec(fmt::format("UPDATE meta SET value = '{}' WHERE key = 'recorder_max_rss_kb'", ru.ru_maxrss));
  } catch (const std::exception& e) {
    log_debug("could not store the recorder's peak memory: {}", e.what());
  }
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
    if (!launch_ring_dir_.empty() && (v.starts_with("LD_PRELOAD=") || v.starts_with(GS_LAUNCH_RING_ENV "=") ||
                                      v.starts_with(GS_LAUNCH_STACK_EVERY_ENV "=") || v.starts_with(GS_HEAP_ALLOC_ENV "=")))
      continue;
    env_strings.emplace_back(*e);
  }
  if (!launch_ring_dir_.empty()) {
    // First among the preloads: its dlsym must come before any other library's lookups.
    const char* preload = getenv("LD_PRELOAD");
    env_strings.push_back("LD_PRELOAD=" + launches_library_ + (preload && *preload ? std::string(":") + preload : ""));
    env_strings.push_back(std::string(GS_LAUNCH_RING_ENV "=") + launch_ring_dir_);
    env_strings.push_back(std::string(GS_LAUNCH_STACK_EVERY_ENV "=") +
                          std::to_string(tracer_->initial_launch_stack_every()));
    if (const uint64_t min = tracer_->heap_alloc_min_bytes())
      env_strings.push_back(std::string(GS_HEAP_ALLOC_ENV "=") + std::to_string(min));
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
  tracer_->add_target(pid);
  if (std::string exe = find_in_path(opts_.command[0]); !exe.empty()) tracer_->check_static_runtime(pid, exe, exe);
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

void Recorder::prepare_launch_rings() {
  launch_probes_ = opts_.tracer.launch_probes;
  const bool asked = launch_probes_ == LaunchProbes::InProcess;
  if (!asked && launch_probes_ != LaunchProbes::Auto) return;
  if (opts_.tracer.all) {
    if (asked)
      throw Error("--launch-probes in-process works with record -- CMD, and with --pid for processes started with "
                  "libgpuscope_launches.so preloaded; with --all use probes");
    launch_probes_ = LaunchProbes::Probes;
    return;
  }
  if (opts_.command.empty()) {
    // --pid: rings in standby (the library preloaded by the processes' owner) are claimed; the
    // processes without one are probed. Without any, as with probes.
    std::vector<pid_t> targets = opts_.pids;
    for (pid_t d : discover::descendants(opts_.pids)) targets.push_back(d);
    const bool any = std::any_of(targets.begin(), targets.end(),
                                 [](pid_t p) { return LaunchRings::standby_ring(discover::read_maps(p)) != nullptr; });
    launch_probes_ = asked || any ? LaunchProbes::InProcess : LaunchProbes::Probes;
    return;
  }
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string exe = n > 0 ? std::string(self, size_t(n)) : std::string();
  launches_library_ = exe.substr(0, exe.rfind('/') == std::string::npos ? 0 : exe.rfind('/')) + "/libgpuscope_launches.so";
  if (access(launches_library_.c_str(), R_OK) != 0) {
    if (asked)
      throw Error("--launch-probes in-process needs {} beside gpuscope; this install lacks it (use probes)",
                  launches_library_);
    log_warn("{} is not beside gpuscope: launches are probed, one trap each (reinstall gpuscope whole for "
             "--launch-probes in-process)",
             launches_library_);
    launches_library_.clear();
    launch_probes_ = LaunchProbes::Probes;
    return;
  }
  launch_probes_ = LaunchProbes::InProcess;
  // A private directory (its socket only), on shared memory's file system where there is one.
  launch_ring_dir_ = LaunchRings::make_dir(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
}

bool Recorder::targets_alive() const {
  for (pid_t p : opts_.pids)
    if (discover::process_exists(p)) return true;
  return false;
}

int Recorder::run() {
  attach::check_can_trace("gpuscope record");
  prepare_gpu_times();
  prepare_launch_rings();
  // Every thread inherits this mask; signals arrive through the signalfd only.
  sigset_t sigs = handled_signals();
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  const int sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
  writer_ = std::make_unique<store::RecordWriter>(opts_.output);

  utsname u{};
  uname(&u);
  const std::string mode = opts_.tracer.all ? "all" : !opts_.pids.empty() ? "pid" : "command";
  std::string what = join(opts_.command);
  for (pid_t p : opts_.pids) what += (what.empty() ? "" : " ") + std::to_string(p);
  writer_->set_meta("gpuscope_version", GPUSCOPE_VERSION);
  writer_->set_meta("recorder_pid", std::to_string(getpid()));
  writer_->set_meta("host", u.nodename);
  writer_->set_meta("kernel", u.release);
  writer_->set_meta("mode", mode);
  writer_->set_meta("command", what);
  writer_->set_meta("clock", "CLOCK_MONOTONIC");
  writer_->set_meta("realtime_offset_ns", std::to_string(realtime_ns() - monotonic_ns()));
  writer_->set_meta("cuda_driver_version", driver_version());
  writer_->set_meta("stacks", opts_.tracer.stacks ? "1" : "0");

  TracerOptions topts = opts_.tracer;
  // Kernels loaded before gpuscope started are named only by their runtime registration, so
  // the runtime's launch probes stay where processes are joined late.
  topts.whole_history = opts_.pids.empty() && !opts_.tracer.all;
  topts.launch_probes = launch_probes_;
  topts.launch_ring_dir = launch_ring_dir_;
  topts.launches_library = launches_library_;
  tracer_ = std::make_unique<Tracer>(topts, *writer_);
  tracer_->start();

  const uint64_t start_ns = monotonic_ns();
  writer_->set_meta("start_ns", std::to_string(start_ns));
  int exit_code = 0;
  try {
    if (opts_.tracer.all) {
      for (pid_t p : discover::list_pids())
        if (p != getpid()) tracer_->attach_mapped_libraries(p);
    } else if (!opts_.pids.empty()) {
      std::vector<pid_t> all = opts_.pids;
      for (pid_t d : discover::descendants(opts_.pids)) all.push_back(d);
      for (pid_t p : all) {
        tracer_->add_target(p);
        tracer_->attach_mapped_libraries(p);
      }
    } else {
      // A command gpuscope starts can wait the fraction of a second the stack walker takes to
      // load; a running process attached to is recorded at once, its first stacks sent as copies.
      tracer_->wait_for_stack_walker();
      child_ = spawn_command();
    }
    // From here the record replaces what -o named (until now a command that cannot run, or an
    // error attaching, left it as it was).
    writer_->keep();
    if (!opts_.tracer.quiet)
      log_info("recording {} into {}{}", opts_.tracer.all ? "every process" : mode == "pid" ? "PID " + what : what,
               opts_.output, opts_.duration_s > 0 ? fmt::format(" for {}s", opts_.duration_s) : "");
    // After the command has started: a command that cannot run fails with its own error alone.
    tracer_->start_gpu_metrics();
    if (opts_.tracer.host_telemetry) tracer_->start_pressure(2);

    const uint64_t deadline = deadline_after_ns(start_ns, opts_.duration_s);
    bool running = true;
    while (running) {
      pollfd fds[2] = {{sfd, POLLIN, 0}, {tracer_->control_fd(), POLLIN, 0}};
      ::poll(fds, 2, tracer_->control_poll_ms());
      tracer_->tick(fds[1].revents & POLLIN);
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
        if (!opts_.tracer.quiet) log_info("the target process exited");
        running = false;
      }
      if (deadline && monotonic_ns() >= deadline) running = false;
    }
    tracer_->handle_control();
  } catch (...) {
    tracer_->stop();
    if (child_ || opts_.tracer.all || !opts_.pids.empty()) {
      writer_->set_meta("end_ns", std::to_string(monotonic_ns()));
      writer_->finish();
    } else {
      writer_->discard();  // the command never ran: nothing to keep
    }
    throw;
  }

  tracer_->stop();
  tracer_->report_unwind_tables();
  tracer_->report_stack_walks();
  const uint64_t end_ns = monotonic_ns();
  writer_->set_meta("end_ns", std::to_string(end_ns));
  writer_->set_meta("python_stack_generations", std::to_string(tracer_->stats().stacks.python_stack_generations));
  if (const auto st = tracer_->stats().stacks; st.handoffs)
    writer_->set_meta("handoffs", fmt::format("{} calls; {} calls and samples stored below one", st.handoffs, st.stitched));
  if (const auto st = tracer_->stats().stacks; st.copy_holes_read || st.copy_holes_zeroed)
    writer_->set_meta("stack_copy_holes",
                      fmt::format("{} pieces of stack copies not mapped at the probe: {} read from the live stack, {} "
                                  "taken as zeros (the process was gone)",
                                  st.copy_holes_read + st.copy_holes_zeroed, st.copy_holes_read, st.copy_holes_zeroed));
  if (const auto n = tracer_->stats().heap_allocs_unrecorded)
    writer_->set_meta("heap_allocs_unrecorded",
                      fmt::format("{} large heap blocks were not recorded (the hooks' limit of {} a second, or "
                                  "their table of live blocks full)",
                                  n, GS_HEAP_ALLOCS_PER_S));
  record_own_cost();
  writer_->finish(/*seal_later=*/true);
  close(sfd);
  store_gpu_times(start_ns, end_ns);
  record_peak_memory();
  writer_->seal();

  const auto st = tracer_->stats();
  const auto lost = tracer_->bpf().lost();
  uint64_t lost_total = st.queue_dropped_records, stacks_cut = 0;
  // Walks cut short keep their first frames: said apart from events lost.
  for (int cause = 0; cause < GS_LOST_NR; ++cause)
    (cause >= GS_LOST_UNWIND_NO_ROW && cause <= GS_LOST_UNWIND_DEPTH ? stacks_cut : lost_total) +=
        cause == GS_LOST_UNWIND_NO_TABLE ? 0 : lost[cause];
  lost_total += writer_->calls_dropped();
  if (!opts_.tracer.quiet) {
    log_info("recorded {} CUDA calls ({} kernel launches){} into {}; {} events lost", st.calls, st.launches,
             opts_.tracer.cpu_profile_hz ? fmt::format(" and {} CPU samples", st.samples) : "", opts_.output, lost_total);
    if (stacks_cut)
      log_info("{} user stacks walked from .eh_frame were cut short (see lost counters unwind_*)", stacks_cut);
    if (writer_->disk_full())
      log_warn("{} CUDA calls made after the disk filled are not in the record (lost counter disk_full)",
               writer_->calls_dropped());
    if (st.calls == 0 && tracer_->libraries_attached() == 0 && tracer_->verbs_attached())
      log_info("no CUDA library was loaded by the target; its RDMA verbs calls are recorded");
    else if (st.calls == 0)
      log_info("{}", tracer_->libraries_attached() == 0 ? "no CUDA library was loaded by the target: nothing to record"
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
