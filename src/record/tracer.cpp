#include "record/tracer.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/ranges.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "cuda/functions.h"
#include "cuda/handoffs.h"
#include "discover/proc.h"
#include "elf/elf_file.h"

namespace gpuscope::record {

// Messages from the ring-buffer thread to the control loop.
class Tracer::ControlQueue {
 public:
  ControlQueue() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) throw Error("eventfd: {}", strerror(errno));
  }
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
  // wake: now (the agent lets go of an exited process at once); otherwise at the next wake-up.
  void push_exit(pid_t pid, uint64_t ts_ns, bool wake_now) {
    std::lock_guard lock(mu_);
    exits_.emplace_back(pid, ts_ns);
    if (wake_now) wake();
  }
  void take(std::vector<gs_libload_record>& libloads, std::vector<pid_t>& execs) {
    uint64_t v;
    [[maybe_unused]] auto n = read(fd_, &v, sizeof(v));
    std::lock_guard lock(mu_);
    libloads.swap(libloads_);
    execs.swap(execs_);
  }
  std::vector<std::pair<pid_t, uint64_t>> take_exits() {
    std::lock_guard lock(mu_);
    return std::exchange(exits_, {});
  }
  // Another thread has something for the control loop's periodic work (a compiled unwind table).
  void wake() {
    uint64_t one = 1;
    [[maybe_unused]] auto n = write(fd_, &one, sizeof(one));
  }

 private:
  int fd_;
  std::mutex mu_;
  std::vector<gs_libload_record> libloads_;
  std::vector<pid_t> execs_;
  std::vector<std::pair<pid_t, uint64_t>> exits_;
};

void StoppedProcesses::answer(pid_t pid, const gs_stop_count& stop) {
  // Without CAP_KILL (root with capabilities dropped) the process would stay stopped: say so.
  if (kill(pid, SIGCONT) != 0 && errno != ESRCH)
    log_error("cannot continue PID {}, stopped while its CUDA library was probed: {} (gpuscope needs CAP_KILL)", pid,
              strerror(errno));
  // After the signal: dying in between leaves the stop unanswered for the guardian.
  if (bpf_) bpf_->answer_stop(pid, stop);
}

void StoppedProcesses::resume(pid_t pid) {
  auto it = stops_.find(pid);
  if (it == stops_.end()) return;
  answer(pid, it->second);
  stops_.erase(it);
}

StoppedProcesses::~StoppedProcesses() {
  for (const auto& [pid, stop] : stops_) answer(pid, stop);
}

Tracer::Tracer(const TracerOptions& opts, store::EventSink& sink)
    : opts_(opts), sink_(sink), control_(std::make_unique<ControlQueue>()) {
  attach::SessionConfig cfg;
  const bool in_process = opts_.launch_probes == LaunchProbes::InProcess;
  // In-process too, the runtime's launch probes stay until the driver is probed: without a
  // driver (none installed, or not found) they alone see the launches, which fail.
  cfg.runtime_launch_probes = opts_.launch_probes != LaunchProbes::Driver;
  cfg.launch_probes = !in_process;
  // Processes joined late (--pid) whose rings cannot be claimed keep both sides' launch probes,
  // as with probes: the runtime's name kernels loaded before gpuscope came.
  cfg.runtime_launches_per_process = in_process && !opts_.whole_history;
  detach_runtime_launches_with_driver_ = (opts_.launch_probes == LaunchProbes::Auto ||
                                          opts_.launch_probes == LaunchProbes::Probes || in_process) &&
                                         opts_.whole_history;
  drop_redundant_runtime_ = opts_.launch_probes != LaunchProbes::Both;
  sink_.set_meta("launch_probes", in_process                                 ? "in-process"
                                  : opts_.launch_probes == LaunchProbes::Driver ? "driver"
                                  : detach_runtime_launches_with_driver_     ? "driver once probed"
                                                                              : "runtime and driver");
  if (in_process) {
    launch_rings_ = std::make_unique<LaunchRings>(opts_.launch_ring_dir);
    // The hooks hand 1 launch in N to the probe on gpuscope_launch_stack for its stack: N from
    // --stack-every, or from the budget (starting at 1, as the probes' sampling does).
    launch_rings_->set_initial_stack_every(initial_launch_stack_every());
    launch_rings_->on_name([this](uint32_t pid, uint64_t function, std::string_view name) {
      // On the ring-buffer thread, ahead of the launches read with it.
      const size_t length = std::min<size_t>(name.size(), UINT16_MAX);
      name_record_.resize(sizeof(gs_function_name_record) + length);
      gs_function_name_record r{};
      r.kind = GS_REC_FUNCTION_NAME;
      r.length = uint16_t(length);
      r.pid = pid;
      r.function = function;
      std::memcpy(name_record_.data(), &r, sizeof r);
      std::memcpy(name_record_.data() + sizeof r, name.data(), length);
      pipeline_->push(name_record_.data(), name_record_.size());
    });
  }
  cfg.filter_targets = !opts_.all;
  cfg.program_stats = opts_.bpf_stats;
  cfg.program_stats_optional = opts_.bpf_stats_optional;
  cfg.call_unwind_tables = opts_.table_unwind_calls && opts_.stacks;
  cfg.sample_unwind_tables = opts_.table_unwind_samples && opts_.cpu_profile_hz > 0;
  cfg.call_stack_copy = opts_.dwarf_unwind_calls && opts_.stacks && !cfg.call_unwind_tables;
  cfg.sample_stack_copy = opts_.dwarf_unwind_samples && !cfg.sample_unwind_tables;
  cfg.walk_user_stacks = opts_.stacks || opts_.cpu_profile_hz > 0;
  cfg.unwind_rows = uint32_t((uint64_t(opts_.unwind_table_mb) << 20) / sizeof(gs_unwind_row));
  sink_.set_meta("call_unwinding", !opts_.stacks                ? "none"
                                   : cfg.call_unwind_tables   ? "eh-frame"
                                   : opts_.dwarf_unwind_calls ? "dwarf"
                                                              : "frame pointers");
  cfg.capture_stacks = opts_.stacks;
  cfg.stack_budget = opts_.stacks && opts_.stack_budget > 0;
  cfg.stack_every = opts_.stacks && !cfg.stack_budget ? std::max<uint32_t>(opts_.stack_every, 1) : 1;
  if (cfg.stack_every > 1) sink_.set_meta("stack_every", std::to_string(cfg.stack_every));
  if (cfg.stack_budget) {
    stack_budget_ = std::make_unique<StackBudget>(opts_.stack_budget);
    sink_.set_meta("stack_budget", fmt::format("{}", opts_.stack_budget));
  }
  cfg.python_stacks = opts_.stacks && opts_.python_stacks;
  sink_.set_meta("python_stacks", cfg.python_stacks ? "1" : "0");
  cfg.stop_for_shared_objects = !opts_.all;
  cfg.high_rate_per_process = opts_.high_rate_per_process;
  cfg.floor_probes = opts_.floor_probes;
  if (opts_.floor_probes) sink_.set_meta("floor_probes", "1");
  cfg.sample_only_targets = opts_.all && opts_.only_cuda_processes;
  cfg.ringbuf_bytes = opts_.ringbuf_mb << 20;
  cfg.stack_map_entries = opts_.cpu_profile_hz > 0 ? opts_.stack_map_entries : 0;
  cfg.stack_generations = opts_.cpu_profile_hz > 0 && opts_.pipeline.recycle_stacks_at > 0;
  cfg.wakeup_bytes = cfg.ringbuf_bytes / 4;
  cfg.host_telemetry = opts_.host_telemetry;
  cfg.host_alloc_min_bytes = opts_.host_alloc_min_bytes;
  bpf_ = std::make_unique<attach::BpfSession>(cfg);
  verbs_ = std::make_unique<attach::VerbsProbes>(*bpf_);
  sink_.set_meta("host_telemetry", bpf_->host_telemetry() ? "1" : "0");
  if (launch_rings_ && opts_.stacks && !opts_.launches_library.empty()) {
    // The launches handed over for their stacks: probed in every process that maps the library.
    const auto res = bpf_->attach_file(opts_.launches_library);
    if (!res.error.empty())
      log_warn("could not probe {}: in-process launches are recorded without stacks ({})", opts_.launches_library,
               res.error);
  }
  if (launch_rings_ && opts_.host_alloc_min_bytes > 0 && !opts_.launches_library.empty()) {
    // Large heap blocks, handed over by the library's heap hooks (src/inject/heap_hooks.cpp).
    try {
      bpf_->attach_heap_hooks(opts_.launches_library);
      heap_hooks_ = true;
    } catch (const Error& e) {
      log_warn("large heap blocks are not recorded ({}); `advise` sees the mmap'ed ones only", e.what());
    }
  }
  // Processes are stopped at their CUDA library's load only with a guardian to continue them if
  // gpuscope dies holding one.
  try {
    guardian_ = std::make_unique<attach::StopGuardian>(bpf_->stops_made_fd(), bpf_->stops_answered_fd(),
                                                       bpf_->stop_guard_fd(), bpf_->stopping_program_id());
    stopped_.set_session(bpf_.get());
    // The guardian allows stops once it watches (a few ms): the command starts after that, so
    // that its CUDA library's load is held like any later one.
    const uint64_t until = monotonic_ns() + 2'000'000'000;
    while (!bpf_->stops_guarded() && monotonic_ns() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!bpf_->stops_guarded()) throw Error("the stop guardian did not start within 2 s");
  } catch (const Error& e) {
    guardian_.reset();
    log_warn("{}: processes are not stopped at their CUDA library's load, so their first CUDA calls may run before "
             "the probes are in place",
             e.what());
  }
  if (opts_.cpu_profile_hz) {
    bpf_->start_cpu_sampling(opts_.cpu_profile_hz);
    sink_.set_meta("cpu_profile_hz", std::to_string(opts_.cpu_profile_hz));
    sink_.set_meta("sample_unwinding", cfg.sample_unwind_tables ? "eh-frame"
                                       : cfg.sample_stack_copy  ? "dwarf"
                                                                : "frame pointers");
  }

  PipelineConfig pcfg = opts_.pipeline;
  pcfg.complete_history = opts_.whole_history;
  if (!cfg.stack_generations) pcfg.recycle_stacks_at = 0;
  stack_maps_ = std::make_unique<BpfStackMaps>(*bpf_);
  pipeline_ = std::make_unique<Pipeline>(sink_, *stack_maps_, [b = bpf_.get()] { return b->lost(); }, maps_, pcfg);
  if (bpf_->unwind_tables_enabled()) {
    unwind_ = std::make_unique<UnwindTables>(*bpf_, opts_.unwind_cache_dir, [q = control_.get()] { q->wake(); });
    // A copy's frames name every file its walk would need at once, where the walk stops at the
    // first: all of their tables are made in one round.
    pipeline_->stacks().on_copy_unwound(
        [u = unwind_.get()](uint32_t pid, const std::vector<uint64_t>& ips) { u->note_frames(pid, ips); });
    lifetime_.on_exit([u = unwind_.get()](uint32_t pid, uint64_t) { u->forget(static_cast<pid_t>(pid)); });
  }
  lifetime_.on_exit([this](uint32_t pid, uint64_t) { forget_process(static_cast<pid_t>(pid)); });
  // Records the pipeline routes to the control loop (Pipeline's kRoutes), from the ring-buffer thread.
  pipeline_->on_control_record([this](uint16_t kind, const void* data) {
    if (kind == GS_REC_LIBLOAD) control_->push_libload(*static_cast<const gs_libload_record*>(data));
    const auto* proc = static_cast<const gs_proc_record*>(data);
    if (kind == GS_REC_EXEC) control_->push_exec(static_cast<pid_t>(proc->pid));
    if (kind == GS_REC_EXIT) control_->push_exit(static_cast<pid_t>(proc->pid), proc->ts_ns, opts_.all);
  });
  if (!launch_rings_)
    bpf_->set_handler([p = pipeline_.get()](const void* data, size_t size) { p->push(data, size); });
  else
    bpf_->set_handler([this](const void* data, size_t size) { push_beside_launch_rings(data, size); });
}

void Tracer::push_beside_launch_rings(const void* data, size_t size) {
  // The rings' records of calls before this one, first: a launch handed to gpuscope_launch_stack
  // comes after its thread's calls before it (its kernel's cuKernelGetFunction), and a process's
  // exit or exec after all it did (the pipeline forgets its kernels' names there).
  static const uint16_t marker = cuda::function_by_symbol("gpuscope_launch_stack")->id;
  uint16_t kind = 0;
  if (size >= sizeof kind) std::memcpy(&kind, data, sizeof kind);
  if (kind == GS_REC_CALL && size >= sizeof(gs_call_record)) {
    gs_call_record head;
    std::memcpy(&head, data, sizeof head);
    if (head.func == marker) {
      drain_launch_rings(false, head.ts_ns, true);
      // The launch it carries, in its ring's clock: in nanoseconds, as the ring's records.
      gs_launch_record launch;
      if ((head.flags & GS_CALL_DEREF_OK) && head.deref_len >= sizeof launch) {
        std::memcpy(&launch, head.deref, sizeof launch);
        if (launch_rings_->times_to_ns(pid_t(head.pid), launch)) {
          marker_copy_.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size);
          std::memcpy(marker_copy_.data() + offsetof(gs_call_record, deref), &launch, sizeof launch);
          pipeline_->push(marker_copy_.data(), size);
          return;
        }
      }
    }
  } else if ((kind == GS_REC_EXIT || kind == GS_REC_EXEC) && size >= sizeof(gs_proc_record)) {
    gs_proc_record proc;
    std::memcpy(&proc, data, sizeof proc);
    drain_launch_rings(false, proc.ts_ns, true);
  }
  pipeline_->push(data, size);
}

Tracer::~Tracer() {
  if (!stopped_threads_) stop();
}

void Tracer::start() {
  pipeline_->start();
  consuming_ = true;
  consumer_ = std::thread([this] {
    name_this_thread("gs-ringbuf");
    // The launch rings wake no one: they are read at least every kRingPollMs.
    const int poll_ms = launch_rings_ ? std::min(opts_.poll_ms, kRingPollMs) : opts_.poll_ms;
    while (consuming_.load(std::memory_order_relaxed)) {
      bpf_->poll(poll_ms);
      if (launch_rings_) {
        // The records of calls entered before `upto`, after the probes' events from before it.
        const uint64_t upto = monotonic_ns();
        bpf_->poll(0);
        drain_launch_rings(false, upto);
      }
      pipeline_->end_batch();
    }
  });
}

void Tracer::stop() {
  if (stopped_threads_) return;
  stopped_threads_ = true;
  // No new stops from here on; those already made are in the ring buffer or the control queue,
  // and are answered below, so that no process is left stopped (in the ring of a tracer that
  // never consumed, they are still listed: the guardian's last round continues them).
  bpf_->stop_stopping_processes();
  if (consuming_.exchange(false)) {
    consumer_.join();
    while (bpf_->poll(0) > 0) pipeline_->end_batch();  // drain what is left
    if (launch_rings_) drain_launch_rings(true);
    pipeline_->end_batch();
    handle_control();
  }
  if (launch_rings_) report_launch_rings();
  report_verbs();
  if (guardian_) guardian_->ended_in_order();
  if (nvml_) nvml_->stop();
  pressure_.stop();
  pipeline_->stop();
}

int Tracer::control_fd() const { return control_->fd(); }

void Tracer::wait_for_stack_walker() {
  bpf_->wait_for_walker(10'000'000'000);
}

void Tracer::process_gone(pid_t pid) { lifetime_.exited(static_cast<uint32_t>(pid), 0); }

void Tracer::add_target(pid_t pid) { bpf_->add_target(pid); }

void Tracer::drain_launch_rings(bool final, uint64_t upto_ns, bool discover) {
  const uint64_t now = monotonic_ns();
  if (final || discover || now >= rings_discovered_ns_ + kRingDiscoverNs) {
    launch_rings_->discover();
    rings_discovered_ns_ = now;
  }
  auto push = [this](uint32_t pid, const gs_launch_record& r) {
    auto name = thread_comms_.find(r.tid);
    if (name == thread_comms_.end()) {
      if (thread_comms_.size() >= 65536) thread_comms_.clear();
      auto comm = read_text_file(fmt::format("/proc/{}/task/{}/comm", pid, r.tid));
      if (!comm) comm = read_text_file(fmt::format("/proc/{}/comm", pid));
      std::string c = comm.value_or("");
      if (!c.empty() && c.back() == '\n') c.pop_back();
      name = thread_comms_.emplace(r.tid, std::move(c)).first;
    }
    gs_call_record rec;
    if (!LaunchRings::to_call_record(pid, r, name->second, rec)) return;
    if (r.api != GS_LAUNCH_CU_KERNEL_GET_FUNCTION) ++ring_launches_;
    pipeline_->push(&rec, sizeof rec);
  };
  std::vector<pid_t> exited;
  {
    std::lock_guard lock(ring_exits_mu_);
    exited.swap(ring_exits_);
  }
  launch_rings_->drain(push, upto_ns);
  for (pid_t pid : exited) launch_rings_->forget(pid, push);
  if (final)
    for (pid_t pid : launch_rings_->received()) launch_rings_->forget(pid, push);
}

void Tracer::check_launch_hooks(pid_t pid) {
  if (!launch_hooks_checked_.insert(pid).second) return;
  // The preload is mapped when the program starts, before any CUDA library can load.
  const auto maps = discover::read_maps(pid);
  const auto hooks = std::find_if(maps.begin(), maps.end(),
                                  [](const auto& m) { return discover::is_launch_hooks_library(m.path); });
  std::string why;
  if (hooks == maps.end()) {
    why = opts_.whole_history ? "runs without libgpuscope_launches.so (its environment dropped LD_PRELOAD?)"
                              : "was not started with libgpuscope_launches.so preloaded";
  } else if (opts_.whole_history) {
    return;  // started by gpuscope: its ring comes to the socket
  } else {
    // Joined late: its ring, in standby, is claimed; then its hooks are probed for the launches
    // they hand over for their stacks, and only then asked to.
    uint32_t reader = 0;
    switch (launch_rings_->claim(pid, maps, &reader)) {
      case LaunchRings::Claim::Claimed:
        claimed_rings_.push_back(pid);
        if (opts_.stacks) {
          const auto res = bpf_->attach_file(discover::path_in_target(pid, hooks->path));
          if (res.error.empty()) {
            launch_rings_->set_stack_every(pid, initial_launch_stack_every());
          } else {
            rings_without_stacks_.insert(pid);
            log_warn("could not probe {} in PID {}: its launches are recorded without stacks ({})", hooks->path, pid,
                     res.error);
          }
        }
        if (!opts_.quiet) log_info("PID {} ({}): launches read from its launch ring, no trap each", pid, discover::read_comm(pid));
        return;
      case LaunchRings::Claim::NoRing:
        why = "has no launch ring yet (its CUDA start-up was under way)";
        break;
      case LaunchRings::Claim::Taken:
        why = fmt::format("has its launch ring read by another gpuscope (PID {})", reader);
        break;
      case LaunchRings::Claim::Refused:
        why = "has a launch ring gpuscope could not open or read";
        break;
    }
  }
  try {
    bpf_->set_high_rate_probes(pid, true);
    launch_probed_.push_back(pid);
    if (!opts_.quiet)
      log_warn("PID {} ({}) {}: its launches are probed instead, one trap each", pid, discover::read_comm(pid), why);
  } catch (const std::exception& e) {
    log_error("PID {} {} and its launches could not be probed: {}", pid, why, e.what());
  }
}

void Tracer::report_launch_rings() {
  sink_.set_meta("launch_ring_launches", std::to_string(ring_launches_));
  const uint64_t lost = launch_rings_->lost();
  sink_.set_meta("launch_ring_lost", std::to_string(lost));
  sink_.set_meta("launch_ring_processes", std::to_string(launch_rings_->received().size()));
  if (lost)
    log_warn("{} launches did not fit their processes' launch rings and are not in the record (counted in meta "
             "launch_ring_lost)",
             lost);
  if (!launch_probed_.empty()) sink_.set_meta("launch_probed_processes", fmt::format("{}", fmt::join(launch_probed_, ",")));
  if (!claimed_rings_.empty()) sink_.set_meta("launch_ring_claimed", fmt::format("{}", fmt::join(claimed_rings_, ",")));
  sink_.set_meta("launch_ring_names", std::to_string(launch_rings_->names()));
  if (const uint64_t n = launch_rings_->names_lost()) {
    sink_.set_meta("launch_ring_names_lost", std::to_string(n));
    log_warn("{} kernel names did not fit their processes' launch rings: kernels loaded before gpuscope came may go "
             "unnamed", n);
  }
  std::error_code ec;
  if (!opts_.launch_ring_dir.empty()) std::filesystem::remove_all(opts_.launch_ring_dir, ec);
}

void Tracer::forget_process(pid_t pid) {
  if (launch_rings_) {
    launch_hooks_checked_.erase(pid);
    std::lock_guard lock(ring_exits_mu_);
    ring_exits_.push_back(pid);
  }
  cuda_processes_.erase(pid);
  pressure_.watch(pid, false);
  bpf_->forget_process(pid);
  if (opts_.only_cuda_processes) bpf_->remove_target(pid);
}

void Tracer::attach_library(pid_t pid, const std::string& open_path, const std::string& shown_path, uint64_t ts_ns,
                            bool at_load) {
  auto res = bpf_->attach_file(open_path);
  if (res.error.empty() && opts_.all && !cuda_processes_.contains(pid)) bpf_->add_host_process(pid);
  if (res.error.empty() && !cuda_processes_.contains(pid)) pressure_.watch(pid, true);
  if (res.error.empty() && launch_rings_) check_launch_hooks(pid);
  if (res.error.empty() && cuda_processes_.insert(pid).second && opts_.only_cuda_processes) {
    bpf_->add_target(pid);  // sampled from now on
    if (on_cuda_process) on_cuda_process(pid, at_load);
  }
  if (res.driver_probed_ns) pipeline_->note_driver_probed(pid, res.driver_probed_ns);
  if (res.already_attached) return;
  store::LibraryRow row{static_cast<uint32_t>(pid), shown_path, res.build_id, res.runtime_probes, res.driver_probes,
                        ts_ns, res.error};
  if (!res.error.empty() && !discover::process_exists(pid))  // it exited meanwhile: nothing to say
    log_debug("PID {} exited while {} was being probed: {}", pid, shown_path, res.error);
  else if (!res.error.empty())
    log_error("could not probe {} in PID {}: {}", shown_path, pid, res.error);
  else if (res.runtime_probes + res.driver_probes + res.nccl_probes > 0)
    ++libraries_attached_;
  if (res.error.empty() && res.driver_probes > 0 && detach_runtime_launches_with_driver_ &&
      bpf_->runtime_launch_probes()) {
    // Every runtime launch that can run goes through the driver's launch functions, which are
    // probed from now on; its runtime probe would only add a second trap.
    const int n = bpf_->detach_runtime_launch_probes();
    sink_.set_meta("runtime_launch_probes_removed_at_ns", std::to_string(ts_ns));
    log_debug("driver probed: launch probes removed from {} runtime link(s); launches recorded by the driver", n);
  }
  if (!opts_.quiet && res.error.empty())
    log_info("probing {} ({} runtime, {} driver{} functions) first used by PID {}", shown_path, res.runtime_probes,
             res.driver_probes, res.nccl_probes ? fmt::format(", {} NCCL", res.nccl_probes) : "", pid);
  pipeline_->add_library(std::move(row));
}

bool Tracer::check_static_runtime(pid_t pid, const std::string& exe_path, const std::string& shown, bool at_load) {
  struct stat st{};
  if (stat(exe_path.c_str(), &st) != 0 || !checked_executables_.insert({st.st_dev, st.st_ino}).second) return false;
  if (discover::is_cuda_runtime_library(shown) || discover::is_cuda_driver_library(shown)) return false;
  // A file that is not ELF (a script) defines nothing.
  // NCCL links the runtime statically, and is probed for its own API too.
  if (!elf::defines_any_function(exe_path, {"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMalloc", "ncclAllReduce"}))
    return false;
  attach_library(pid, exe_path, shown + (discover::is_nccl_library(shown) ? "" : " (static CUDA runtime)"),
                 monotonic_ns(), at_load);
  return true;
}

void Tracer::attach_handoffs(pid_t pid, const std::string& open_path, const std::string& shown) {
  if (!opts_.stacks || !cuda::may_define_handoffs(shown)) return;
  struct stat st{};
  if (stat(open_path.c_str(), &st) != 0 || !handoff_files_.insert({st.st_dev, st.st_ino}).second) return;
  for (const auto& h : cuda::all_handoffs()) {
    if (!cuda::may_define(h, shown)) continue;
    std::vector<std::string> prefixes{std::string(h.caller)};
    for (auto w : h.workers) prefixes.emplace_back(w);
    std::vector<StackResolver::WorkerRange> workers;
    std::vector<uint64_t> callers;
    const uint64_t t0 = monotonic_ns();
    try {
      for (const auto& f : elf::functions_with_prefixes(open_path, prefixes)) {
        if (f.name.starts_with(h.caller))
          callers.push_back(f.start);
        else
          workers.push_back({f.start, f.end, h.id});
      }
      if (callers.empty() || workers.empty()) {
        log_debug("{} lacks the functions of {}: its threads' stacks stay unstitched", shown, h.label);
        continue;
      }
      // The workers first: the pipeline knows them before any handoff comes.
      pipeline_->stacks().add_handoff_workers(elf::read_build_id(open_path), shown, std::move(workers));
      for (uint64_t off : callers) bpf_->attach_entry_probe(open_path, off, h.id);
    } catch (const std::exception& e) {
      log_warn("cannot probe {} in {} (PID {}): {}; its threads' stacks stay unstitched", h.label, shown, pid, e.what());
      continue;
    }
    sink_.set_meta("handoffs_probed", std::string(h.label));
    if (!opts_.quiet)
      log_info("probing {} in {} (its symbols read in {} ms): stacks of its threads are shown under the call that "
               "started their work", h.label, shown, (monotonic_ns() - t0) / 1'000'000);
  }
}

void Tracer::attach_verbs(pid_t pid, const std::string& open_path, const std::string& shown) {
  if (!discover::is_verbs_library(shown) && !discover::is_mlx5_library(shown)) return;
  try {
    if (const int n = verbs_->attach_library(open_path); n > 0 && !opts_.quiet)
      log_info("probing {} ({} RDMA verbs functions) first used by PID {}", shown, n, pid);
  } catch (const std::exception& e) {
    log_error("could not probe {} in PID {}: {}", shown, pid, e.what());
  }
}

void Tracer::resolve_verbs() {
  // A map lookup a tick while no context waits; reading one is a few system calls.
  if (const int n = verbs_->resolve_contexts(); n > 0)
    for (size_t i = verbs_->provider_probes().size() - n; i < verbs_->provider_probes().size(); ++i) {
      const auto& [path, offset, op] = verbs_->provider_probes()[i];
      log_debug("RDMA provider function probed: {}+{:#x} (op {})", path, offset, op);
    }
}

void Tracer::report_verbs() {
  resolve_verbs();
  if (!verbs_->provider_probes().empty())
    sink_.set_meta("rdma_provider_functions", std::to_string(verbs_->provider_probes().size()));
  for (const auto& [why, n] : verbs_->skipped()) {
    sink_.set_lost(why, n);
    log_warn("{} RDMA provider function(s) not probed ({}): their posts or completions are not in the record", n, why);
  }
}

void Tracer::find_python(pid_t pid) {
  if (!opts_.python_stacks || !opts_.stacks) return;
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
  const std::string version = b.micro < 0 ? fmt::format("{}.{}", b.major, b.minor)
                                          : fmt::format("{}.{}.{}", b.major, b.minor, b.micro);
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
  pipeline_->stacks().add_python_process(pid, *py);
  if (python_versions_said_.insert(version).second && !opts_.quiet)
    log_info("PID {} runs Python {} ({}): its stacks show Python functions and lines", pid, version, b.path);
  else
    log_debug("PID {} runs Python {} ({})", pid, version, b.path);
}

void Tracer::attach_mapped_libraries(pid_t pid) {
  std::set<std::string> seen;
  std::vector<std::string> handoff_files;
  bool has_cuda = false;
  for (const auto& m : discover::read_maps(pid)) {
    if (m.path.empty() || !seen.insert(m.path).second) continue;
    if (discover::is_cuda_runtime_library(m.path) || discover::is_cuda_driver_library(m.path)) {
      has_cuda = true;
      attach_library(pid, discover::path_in_target(pid, m.path), m.path, monotonic_ns(), false);
    }
    if (cuda::may_define_handoffs(m.path)) handoff_files.push_back(m.path);
    attach_verbs(pid, discover::path_in_target(pid, m.path), m.path);
  }
  if (has_cuda || !opts_.all)
    check_static_runtime(pid, "/proc/" + std::to_string(pid) + "/exe", discover::read_exe(pid), false);
  if (!has_cuda && !opts_.all && !opts_.quiet)
    log_info("PID {} has no CUDA library loaded yet; its probes attach when it loads one", pid);
  if (opts_.all && opts_.only_cuda_processes && !has_cuda) return;
  maps_.refresh(pid);
  if (unwind_) unwind_->update(pid);
  find_python(pid);
  // Last: reading libtorch's symbols takes a while, and the CUDA probes matter more.
  for (const auto& path : handoff_files) attach_handoffs(pid, discover::path_in_target(pid, path), path);
}

void Tracer::handle_control() {
  std::vector<gs_libload_record> libloads;
  std::vector<pid_t> execs;
  control_->take(libloads, execs);
  for (const auto& l : libloads) {
    const pid_t pid = static_cast<pid_t>(l.pid);
    if (l.stopped) stopped_.add(pid, l.stop);
    const std::string path(l.path, strnlen(l.path, sizeof(l.path)));
    const std::string open_path = discover::path_in_target(pid, path);
    // Stopped at its first CUDA library's load: no CUDA call has run, so every allocation of
    // pinned or registered host memory will be seen.
    const bool first_cuda = l.cuda_name && l.stopped && !cuda_processes_.contains(pid);
    const bool probed = l.cuda_name ? (attach_library(pid, open_path, path, l.ts_ns), true)
                                    : check_static_runtime(pid, open_path, path);
    if (first_cuda && !opts_.whole_history) pipeline_->mark_complete_history(pid);
    // The library is mapped now: name its frames even if the process dies soon. A process
    // stopped here is snapshotted in any case: the C library, mapped after the CUDA runtime,
    // is often in only this snapshot of a short-lived process.
    if (probed || l.stopped) maps_.refresh(pid);
    // Before the process goes on: its first backward pass must find the probe in place.
    attach_handoffs(pid, open_path, path);
    attach_verbs(pid, open_path, path);
    // A libpython is found at its load, before its first Python frame runs.
    if (discover::looks_like_python(path) && !opts_.only_cuda_processes) find_python(pid);
    if (probed && opts_.only_cuda_processes) find_python(pid);
    bpf_->mark_checked(l.dev, l.ino);
    // The process's mappings for the BPF walker, before it runs the new library's code (no
    // compile: ~0.15 ms for a small process; the tables come from worker threads).
    if (unwind_ && (!opts_.only_cuda_processes || cuda_processes_.contains(pid))) {
      unwind_->update(pid);
      unwind_->update_soon(pid);
    }
    if (l.stopped) stopped_.resume(pid);
  }
  for (pid_t pid : execs) {
    // A new image: it has the hooks or not anew (checked at its first CUDA library).
    if (launch_rings_ && launch_hooks_checked_.erase(pid)) bpf_->set_high_rate_probes(pid, false);
    check_static_runtime(pid, "/proc/" + std::to_string(pid) + "/exe", discover::read_exe(pid));
    if (!opts_.only_cuda_processes) find_python(pid);
    if (unwind_ && !opts_.only_cuda_processes) unwind_->update(pid);
  }
}

void Tracer::tick(bool control_readable) {
  if (control_readable) handle_control();
  resolve_verbs();
  check_guardian();
  for (auto [pid, ts_ns] : control_->take_exits()) lifetime_.exited(static_cast<uint32_t>(pid), ts_ns);
  update_unwind_tables();
  adjust_stack_rates();
  drop_redundant_runtime_probes();
}

void Tracer::check_guardian() {
  if (!guardian_ || guardian_->alive()) return;
  // Killed on its own: were gpuscope to die too, nothing would continue a process it held. Stops
  // end here; those made already are answered as usual.
  bpf_->stop_stopping_processes();
  guardian_.reset();
  log_warn("the stop guardian is gone (killed?): processes are no longer stopped at their CUDA library's load, so "
           "their first CUDA calls may run before the probes are in place");
}

void Tracer::update_unwind_tables() {
  if (!unwind_) return;
  unwind_->update_wanted();
}

void Tracer::adjust_stack_rates() {
  if (!stack_budget_) return;
  // Read at most every kPollMs (a few system calls a process); each process's N is decided at
  // its own intervals.
  const uint64_t now = monotonic_ns();
  if (now < stack_budget_checked_ns_ + uint64_t(StackBudget::kPollMs) * 1'000'000) return;
  stack_budget_checked_ns_ = now;
  for (const auto& c : bpf_->stack_costs()) {
    if (kill(c.pid, 0) != 0 && errno == ESRCH) {
      bpf_->forget_stack_budget(c.pid);
      continue;  // its figures stay in the budget's table for the summary
    }
    // In-process launches trap only to have their stack walked (gpuscope_launch_stack), so each
    // walk costs its process the trap as well.
    const uint64_t cost_ns = c.walk_ns + (launch_rings_ ? c.walks * kInProcessTrapNs : 0);
    if (auto every = stack_budget_->observe(c.pid, now, cost_ns, c.walks, c.first_ns)) {
      if (!bpf_->set_stack_rate(c.pid, *every)) ++stack_rates_refused_;
      if (launch_rings_ && !rings_without_stacks_.contains(c.pid)) launch_rings_->set_stack_every(c.pid, *every);
      log_debug("stack budget: PID {} takes the stacks of 1 call in {}", c.pid, *every);
    }
  }
}

void Tracer::drop_redundant_runtime_probes() {
  if (!pipeline_) return;
  auto funcs = pipeline_->take_redundant_runtime_functions();
  if (funcs.empty() || !drop_redundant_runtime_) return;
  const int links = bpf_->detach_runtime_functions(funcs);
  const uint64_t now = monotonic_ns();
  for (uint16_t id : funcs)
    if (const auto* f = cuda::function_by_id(id))
      runtime_probes_removed_.push_back(fmt::format("{} at {}", f->symbol, now));
  sink_.set_meta("runtime_probes_removed", fmt::format("{}", fmt::join(runtime_probes_removed_, ", ")));
  log_debug("{} runtime function(s) recorded by the driver's probes from now on ({} links removed)", funcs.size(),
            links);
}

void Tracer::report_unwind_tables() {
  if (!unwind_) return;
  unwind_->settle();
  if (opts_.table_unwind_calls && opts_.stacks) {
    const int64_t d = bpf_->walker_delay_ns();
    sink_.set_meta("stack_walker", d > 0   ? fmt::format("in place {:.0f} ms after the first probes could be", d / 1e6)
                                   : d < 0 ? "could not be loaded: frame pointers instead"
                                           : "not loaded before the recording ended");
  }
  const auto st = unwind_->stats();
  const std::string text = fmt::format(
      "{} files, {} of {} row slots ({:.1f} of {:.1f} MiB, page indexes included); made {} tables in {:.0f} ms of "
      "worker time ({} from the cache; {} when their process was seen, {} when a walk needed them, which waited "
      "{:.0f} ms at most); {} mapped files never needed; {} without room, {} without frame information, {} evicted; "
      "processes' mappings read {} times ({:.1f} ms in all)",
      st.files, st.rows_used, st.rows_capacity, st.rows_used * sizeof(gs_unwind_row) / 1048576.0,
      st.rows_capacity * sizeof(gs_unwind_row) / 1048576.0, st.files_compiled, st.compile_ns / 1e6, st.files_from_cache,
      st.files_at_sight, st.files_on_demand, st.demand_wait_max_ns / 1e6, st.files_never_needed, st.files_without_room,
      st.files_failed, st.evicted, st.updates, st.update_ns / 1e6);
  sink_.set_meta("unwind_tables", text);
  sink_.set_lost("unwind_table_no_room", st.files_without_room);
  if (!opts_.quiet) log_info("unwind tables: {}", text);
}

// What the BPF stack walks did (their counters in events.h: gs_unwind_stat), in meta and on stderr.
void Tracer::report_stack_walks() {
  const auto walks = bpf_->unwind_stats();
  if (walks[GS_UNWIND_STAT_WALKS]) {
    const double n = double(walks[GS_UNWIND_STAT_WALKS]);
    const std::string walked = fmt::format(
        "{} walks, {:.1f} frames a walk, {:.1f}% of frames stepped from the thread's last walk; "
        "a walk found {:.1f} rows in the row cache and searched the tables for {:.1f}; {:.2f} stack pages read a walk",
        walks[GS_UNWIND_STAT_WALKS], walks[GS_UNWIND_STAT_FRAMES] / n,
        100.0 * walks[GS_UNWIND_STAT_FRAMES_REUSED] / std::max<uint64_t>(walks[GS_UNWIND_STAT_FRAMES], 1),
        walks[GS_UNWIND_STAT_ROWS_CACHED] / n, walks[GS_UNWIND_STAT_ROWS_SEARCHED] / n,
        walks[GS_UNWIND_STAT_PAGES_READ] / n);
    sink_.set_meta("unwind_walks", walked);
    if (!opts_.quiet) log_info("eh-frame walks: {}", walked);
  }
  if (const uint64_t copies = walks[GS_UNWIND_STAT_COPIES]) {
    const std::string text = fmt::format("{} stacks sent as copies and unwound here while a table their walk "
                                         "needed was being made", copies);
    sink_.set_meta("unwind_copies", text);
    if (!opts_.quiet) log_info("{}", text);
  }
  // The frame-pointer and Python walks count walks, frames and reads: each, a walk's average.
  auto per_walk = [&](int at_walks, int at_frames, int at_reads, std::string_view frames_note,
                      std::string_view reads, const char* key, const char* label) {
    if (!walks[at_walks]) return;
    const double n = double(walks[at_walks]);
    const std::string walked = fmt::format("{} walks, {:.1f} frames a walk{}, {:.2f} {} a walk", walks[at_walks],
                                           walks[at_frames] / n, frames_note, walks[at_reads] / n, reads);
    sink_.set_meta(key, walked);
    if (!opts_.quiet) log_info("{}: {}", label, walked);
  };
  per_walk(GS_UNWIND_STAT_FP_WALKS, GS_UNWIND_STAT_FP_FRAMES, GS_UNWIND_STAT_FP_PAGES_READ, "", "stack pages read",
           "fp_walks", "frame-pointer walks");
  per_walk(GS_UNWIND_STAT_PY_WALKS, GS_UNWIND_STAT_PY_FRAMES, GS_UNWIND_STAT_PY_READS, " (shims included)", "reads",
           "python_walks", "Python walks");
  report_stack_budget();
}

void Tracer::report_stack_budget() {
  if (!stack_budget_) return;
  const uint64_t now = monotonic_ns();
  for (const auto& c : bpf_->stack_costs()) stack_budget_->observe(c.pid, now, c.walk_ns, c.walks, c.first_ns);
  std::vector<std::pair<pid_t, StackBudget::Process>> procs(stack_budget_->processes().begin(),
                                                             stack_budget_->processes().end());
  std::ranges::sort(procs, [](const auto& a, const auto& b) { return a.second.max_every > b.second.max_every; });
  uint32_t max_every = 1;
  std::string per;
  for (size_t i = 0; i < procs.size(); ++i) {
    const auto& [pid, p] = procs[i];
    max_every = std::max(max_every, p.max_every);
    if (i < 8)
      per += fmt::format("; PID {}: 1 in {} at the end, at most {}, {} changes, walks {:.2f}% of its time", pid,
                         p.every, p.max_every, p.changes, 100 * p.share());
  }
  if (procs.size() > 8) per += fmt::format("; {} more processes", procs.size() - 8);
  const std::string text =
      fmt::format("launches', copies' and memsets' stack walks within {:g}% of each process's time: their stacks "
                  "taken for 1 call in N, N at most {}{}",
                  100 * stack_budget_->budget(), max_every, per);
  sink_.set_meta("stack_budget_result", text);
  sink_.set_meta("stack_every_max", std::to_string(max_every));
  sink_.set_lost("stack_rate_unset", stack_rates_refused_);
  if (!opts_.quiet && max_every > 1) log_info("stack budget: {}", text);
}

void Tracer::start_pressure(double hz) {
  if (hz <= 0) return;
  if (!host::PressureSampler::available()) {
    // cpu.stat's throttling is still read from the cgroups.
    sink_.set_meta("pressure", "cgroup cpu.stat only: no /proc/pressure (a kernel without PSI, or psi=0)");
  } else {
    sink_.set_meta("pressure", fmt::format("PSI and cgroup cpu.stat, {} a second", hz));
  }
  pressure_.start(hz, [this](std::vector<host::PressureReading>&& r) { pipeline_->add_pressure(std::move(r)); });
}

void Tracer::start_gpu_metrics() {
  const double hz = opts_.gpu_sample_hz;
  if (hz <= 0) {
    sink_.set_meta("gpu_metrics", "off (--gpu-sample-hz 0)");
    return;
  }
  nvml_ = std::make_unique<gpu::NvmlSampler>();
  if (!nvml_->available()) {
    if (!opts_.quiet) log_info("GPU metrics are off: {}", nvml_->error());
    sink_.set_meta("gpu_metrics", "off: " + nvml_->error());
    nvml_.reset();
    return;
  }
  for (const auto& d : nvml_->devices()) sink_.add_gpu(d);
  sink_.set_meta("gpu_metrics", fmt::format("nvml, driver {}", nvml_->driver_version()));
  sink_.set_meta("gpu_sample_hz", fmt::format("{}", hz));
  nvml_->start(hz, [this](gpu::NvmlSampler::Batch&& b) { pipeline_->add_gpu_batch(std::move(b)); },
               opts_.gpu_slow_sample_hz);
}

}  // namespace gpuscope::record
