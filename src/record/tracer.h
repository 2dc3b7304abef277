// The tracing core that `record` and `agent` share: loads the BPF programs, finds the processes
// that use CUDA (given ones, or every one on the host) and probes their libraries as they load
// them, walks Python frames, samples NVML, and runs the pipeline that decodes everything into
// an EventSink. Its owner runs the control loop: poll control_fd() and call handle_control().
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "attach/bpf_session.h"
#include "attach/stop_guardian.h"
#include "attach/verbs_probes.h"
#include "discover/python.h"
#include "gpu/nvml.h"
#include "host/pressure.h"
#include "record/launch_rings.h"
#include "record/pipeline.h"
#include "record/process_lifetime.h"
#include "record/stack_maps.h"
#include "record/stack_budget.h"
#include "record/unwind_tables.h"
#include "store/sink.h"
#include "symbolize/process_maps.h"

namespace gpuscope::record {

// Which probes record a kernel launch made through the CUDA runtime.
enum class LaunchProbes {
  // record: InProcess for a command gpuscope starts (libgpuscope_launches.so beside it), else
  // Probes. A Tracer given Auto treats it as Probes.
  Auto,
  Probes,  // driver only once the driver is probed, when every process is seen from its start
  Driver,  // driver only: one trap per launch; kernels loaded before gpuscope started go unnamed
  Both,    // runtime and driver: two traps per runtime launch, names from either side
  // None probed: each process started with libgpuscope_launches.so preloaded writes its launches
  // into a ring in shared memory (record/launch_rings.h), no trap each. record -- CMD only.
  InProcess,
};

struct TracerOptions {
  bool all = false;            // every process on the host, including those that start later
  // With `all`: look closer (maps, Python) only at processes once they use CUDA.
  bool only_cuda_processes = false;
  bool whole_history = false;  // the targets are followed from their start (record -- CMD)
  bool stacks = true;
  bool python_stacks = true;         // Python frames in the stacks of CPython processes
  // Launches', copies' and memsets' stacks are taken for one call in N, at random, each standing
  // for N (1: all).
  uint32_t stack_every = 1;
  // > 0: instead, N is chosen per process so that those stacks' walks take at most this share
  // of its elapsed time (record/stack_budget.h).
  double stack_budget = 0;
  bool dwarf_unwind_samples = true;  // CPU samples unwound from .eh_frame (false: frame pointers)
  bool dwarf_unwind_calls = false;   // CUDA calls' stacks too (a 16 KiB copy per call)
  // Walked in BPF from .eh_frame tables (record/unwind_tables.h) instead; these win over the two above.
  bool table_unwind_calls = false;
  bool table_unwind_samples = false;
  uint32_t unwind_table_mb = 128;    // the tables' memory cap
  std::string unwind_cache_dir;      // compiled tables kept between runs; empty: none
  LaunchProbes launch_probes = LaunchProbes::Auto;
  std::string launch_ring_dir;   // InProcess: where the processes send their rings
  std::string launches_library;  // InProcess: libgpuscope_launches.so, whose gpuscope_launch_stack is probed
  bool bpf_stats = false;
  bool bpf_stats_optional = false;  // go on without them where they are refused
  bool floor_probes = false;        // benchmarks: the CUDA probes run an empty program
  // High-rate probes (launches, copies, memsets) attached per process, so that each process's
  // can be switched on and off (the agent's overhead budget); low-rate ones stay on for all.
  bool high_rate_per_process = false;
  int cpu_profile_hz = 0;  // 0: no CPU sampling
  // Where each target thread's time goes (bpf/host.bpf.c): the evidence `diagnose` works from.
  bool host_telemetry = false;
  // The targets' anonymous mappings of this size and more with their stacks (`advise` names where
  // a pageable buffer was allocated); 0: not recorded.
  uint64_t host_alloc_min_bytes = 0;
  uint32_t ringbuf_mb = 64;
  // How long the ring buffer's reader sleeps when no one wakes it: the BPF side wakes it once
  // the buffer holds a share of its size (submit_flags), so this bounds only how late a
  // trickle of records arrives, and how often an idle tracer wakes.
  int poll_ms = 20;
  uint32_t stack_map_entries = 8192;  // of each BPF stack map (kernel stacks of CPU samples)
  double gpu_sample_hz = 0;  // NVML samples per second; 0: off
  double gpu_slow_sample_hz = 1;  // of which PCIe and per-process readings (see NvmlSampler::kSlowHz)
  bool quiet = false;
  PipelineConfig pipeline;
};

// Processes stopped by the BPF side while we attach; continued however we leave (by the
// guardian, attach/stop_guardian.h, if gpuscope dies).
class StoppedProcesses {
 public:
  void set_session(attach::BpfSession* bpf) { bpf_ = bpf; }
  void add(pid_t pid, const gs_stop_count& stop) { stops_[pid] = stop; }
  void resume(pid_t pid);
  ~StoppedProcesses();

 private:
  void answer(pid_t pid, const gs_stop_count& stop);
  attach::BpfSession* bpf_ = nullptr;
  std::map<pid_t, gs_stop_count> stops_;  // the last stop of each process held
};

class Tracer {
 public:
  // Loads and attaches the BPF programs (throws Error with what to do). Events go to `sink`.
  Tracer(const TracerOptions& opts, store::EventSink& sink);
  ~Tracer();

  // Starts the ring-buffer and pipeline threads.
  void start();
  // NVML sampling on a thread of its own, if asked for; without NVML, says so once (and in the
  // sink's meta) and goes on without it.
  void start_gpu_metrics();
  // PSI and the CUDA processes' cgroups' CPU throttling, `hz` times a second (record's; 0: off).
  void start_pressure(double hz);
  // Makes `pid` a target (when not tracing every process).
  void add_target(pid_t pid);
  // Probes the CUDA libraries a running process has mapped, and finds its Python.
  void attach_mapped_libraries(pid_t pid);
  // Probes a program's own CUDA runtime, if it links one statically. True if it was probed.
  bool check_static_runtime(pid_t pid, const std::string& exe_path, const std::string& shown, bool at_load = true);
  // Readable when library loads, new programs or exits wait for handle_control().
  int control_fd() const;
  // Before a command starts: lets the eh-frame stack walker finish loading (attach::BpfSession::
  // load_walker), so that its stacks are walked from its first call, and records when it was in.
  void wait_for_stack_walker();
  void handle_control();
  // The control loop's work after each poll of control_fd() (record's and the agent's):
  // handle_control if it was readable, then the periodic chores below.
  void tick(bool control_readable);
  // How long the control loop may wait for control_fd() between ticks.
  int control_poll_ms() const { return stack_budget_ ? StackBudget::kPollMs : 100; }
  // Stops the threads: everything already in the ring buffer is decoded and handed to the sink.
  void stop();

  attach::BpfSession& bpf() { return *bpf_; }
  // InProcess: the N of one launch in N whose stack the hooks hand to the probe, from a
  // process's first launch (GPUSCOPE_LAUNCH_STACK_EVERY) until the budget sets its own; 0: none.
  uint32_t initial_launch_stack_every() const {
    return !opts_.stacks ? 0 : opts_.stack_budget > 0 ? 1 : std::max(opts_.stack_every, 1u);
  }
  // The size from which the heap hooks of a command's launches library hand a block over
  // (GPUSCOPE_HEAP_ALLOC_MIN; 0: their probes are not in place, nothing to hand).
  uint64_t heap_alloc_min_bytes() const { return heap_hooks_ ? opts_.host_alloc_min_bytes : 0; }
  PipelineStats stats() const { return pipeline_->stats(); }
  // Writes what the unwind tables hold and cost into the sink's meta (and says it unless quiet).
  void report_unwind_tables();
  void report_stack_walks();
  // With a stack budget: the N each process ended with, and what its walks cost (meta
  // stack_budget_result, stack_every_max).
  void report_stack_budget();
  int libraries_attached() const { return libraries_attached_; }
  bool verbs_attached() const { return verbs_ && verbs_->any_library(); }
  // Processes' exits as the control loop learns of them (from their records, in tick(), or from
  // process_gone): subscribe to let go of what is kept per process on the control thread.
  ProcessLifetime& lifetime() { return lifetime_; }
  // A process found gone by a sweep of /proc (its exit record was lost): as if its record came.
  void process_gone(pid_t pid);
  // Processes with at least one probed CUDA library.
  const std::set<pid_t>& cuda_processes() const { return cuda_processes_; }
  // With only_cuda_processes: called (on the control thread) when a process's first CUDA
  // library is probed; it is a target (sampled) from then on. `at_load`: probed at that
  // library's load (or its exec: a static runtime), before any CUDA call of it could run; false
  // for a process found running (attach_mapped_libraries).
  std::function<void(pid_t, bool at_load)> on_cuda_process;

 private:
  // Lets go of a process that exited: its per-process probes and state.
  void forget_process(pid_t pid);
  // tick's chores. Answers the BPF walker's requests for tables (a process walking through code
  // its tables lack, such as a library mapped after they were made) and lets go of exited
  // processes' tables.
  void check_guardian();
  void update_unwind_tables();
  // With a stack budget: sets each process's N from what its walks cost (record/stack_budget.h)
  // and lets go of exited processes'.
  void adjust_stack_rates();
  // Removes the probes of runtime functions whose calls the driver's probes were seen to record
  // (decode::Tracker::take_redundant_runtime_functions), unless --launch-probes both; meta
  // runtime_probes_removed names them.
  void drop_redundant_runtime_probes();

  // InProcess: reads the launch rings into the pipeline, on the ring-buffer thread (discovering
  // new rings every kRingDiscoverNs, letting go of exited processes' after a last read), up to
  // the records of calls entered after `upto_ns`. The probes' events and the rings' records are
  // handled in the order of their calls, which naming needs: a launch is named by the lookup
  // before it, and either may come from either side (cuLibraryGetKernel probed,
  // cuKernelGetFunction in the ring; a launch handed to gpuscope_launch_stack after it).
  // `discover`: rings sent since the last look are taken first (a process may have sent its ring
  // and ended within kRingDiscoverNs).
  void drain_launch_rings(bool final, uint64_t upto_ns = UINT64_MAX, bool discover = false);
  // InProcess: the ring buffer's records, each after the rings' records of calls before it.
  void push_beside_launch_rings(const void* data, size_t size);
  static constexpr uint64_t kRingDiscoverNs = 20'000'000;
  // A ring holds 65,536 launches: 5 ms is 13 million launches a second.
  static constexpr int kRingPollMs = 5;
  // What the trap into a probe costs a thread besides the BPF program (the emulated push %rbp
  // and the return: 0.7-1.7 us on these VMs, PLATFORM.md; the H100's launch loop +1.2 us a launch).
  static constexpr uint64_t kInProcessTrapNs = 1500;
  std::vector<uint8_t> marker_copy_;  // ring-buffer thread: a gpuscope_launch_stack record, its times in ns
  // Says what the rings lost, and which processes had their launches probed instead.
  void report_launch_rings();
  // InProcess, at a process's first CUDA library (it is stopped there): a process without the
  // preloaded hooks gets launch probes of its own (BpfSession::set_high_rate_probes).
  void check_launch_hooks(pid_t pid);

  class ControlQueue;
  void attach_library(pid_t pid, const std::string& open_path, const std::string& shown_path, uint64_t ts_ns,
                      bool at_load = true);
  // Probes the calls that hand work to other threads (decode/handoffs.h) if the file defines
  // them, once per file, so that the workers' stacks are stored below their callers'.
  void attach_handoffs(pid_t pid, const std::string& open_path, const std::string& shown_path);
  // RDMA verbs (attach/verbs_probes.h): libibverbs' or libmlx5's probes, once per file; the
  // providers of the contexts handed over since the last tick; at the end, what was skipped.
  void attach_verbs(pid_t pid, const std::string& open_path, const std::string& shown_path);
  void resolve_verbs();
  void report_verbs();
  // Gives the BPF side the process's interpreter, if it runs one gpuscope can walk.
  void find_python(pid_t pid);

  TracerOptions opts_;
  store::EventSink& sink_;
  std::unique_ptr<attach::BpfSession> bpf_;
  std::unique_ptr<attach::VerbsProbes> verbs_;
  symbolize::ProcessMaps maps_;
  std::unique_ptr<StackMaps> stack_maps_;
  std::unique_ptr<Pipeline> pipeline_;
  ProcessLifetime lifetime_;  // the control thread's
  std::unique_ptr<StackBudget> stack_budget_;
  uint64_t stack_budget_checked_ns_ = 0;
  uint64_t stack_rates_refused_ = 0;  // N not set: the process's slot was another's
  std::unique_ptr<UnwindTables> unwind_;  // with table_unwind_*
  std::unique_ptr<ControlQueue> control_;
  std::unique_ptr<attach::StopGuardian> guardian_;  // outlives stopped_: continues what it missed
  StoppedProcesses stopped_;
  std::unique_ptr<gpu::NvmlSampler> nvml_;
  host::PressureSampler pressure_;  // watches the CUDA processes from the start; reads once started
  std::set<std::pair<uint64_t, uint64_t>> checked_executables_;
  std::set<std::pair<uint64_t, uint64_t>> handoff_files_;
  std::map<std::pair<uint64_t, uint64_t>, std::optional<discover::PythonBinary>> python_binaries_;
  std::set<std::string> python_versions_said_;
  std::set<pid_t> cuda_processes_;
  int libraries_attached_ = 0;
  bool detach_runtime_launches_with_driver_ = false;
  bool drop_redundant_runtime_ = false;
  bool heap_hooks_ = false;  // the launches library's heap hooks are probed
  std::vector<std::string> runtime_probes_removed_;
  std::unique_ptr<LaunchRings> launch_rings_;
  std::vector<pid_t> claimed_rings_;   // rings in standby claimed (record --pid)
  // Claimed rings whose hooks could not be probed: never asked to hand launches over for stacks.
  std::set<pid_t> rings_without_stacks_;
  std::vector<uint8_t> name_record_;   // a GS_REC_FUNCTION_NAME being made (ring-buffer thread)
  uint64_t rings_discovered_ns_ = 0;
  std::mutex ring_exits_mu_;
  std::vector<pid_t> ring_exits_;                          // exited processes, for the ring-buffer thread
  std::unordered_map<uint32_t, std::string> thread_comms_;  // tid -> name, for the rings' calls
  std::set<pid_t> launch_hooks_checked_;  // InProcess, control thread: processes (their image) checked
  std::vector<pid_t> launch_probed_;      // InProcess: processes without the hooks, their launches probed
  uint64_t ring_launches_ = 0;
  std::atomic<bool> consuming_{false};
  std::thread consumer_;
  bool stopped_threads_ = false;
};

}  // namespace gpuscope::record
