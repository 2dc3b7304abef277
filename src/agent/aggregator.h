// The agent's sink: instead of a record file, live per-process aggregates (counters by kernel,
// copy direction, allocation...) and each process's stacks of the current profile window.
// Everything is bounded: past each limit detail is shed (kernel names fold into "other", new
// stacks are not kept) and counted, never grown. The pipeline thread writes; exporters read
// snapshots from other threads.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/live_diagnosis.h"
#include "agent/metrics.h"
#include "agent/nccl_counters.h"
#include "agent/observed_cycles.h"
#include "discover/container.h"
#include "report/flamegraph.h"
#include "report/stored_stacks.h"
#include "store/sink.h"

namespace gpuscope::agent {

struct AggregatorLimits {
  size_t max_processes = 2048;          // live ones and those exited since the last export
  size_t max_kernel_names = 100;        // per process; further kernels count as kernel="other"
  size_t max_stacks = 4096;             // distinct stacks held (all processes); the table is
                                        // emptied after an export once it is half full
  size_t max_live_allocations = 1u << 20;  // tracked for the memory-in-use gauges
  // A file's next symbol pass waits this many times as long as its last pass took (see
  // Aggregator::last_symbol_pass_), at most a minute.
  uint64_t symbol_pass_spacing = 100;
  // And passes over all files together at most ~0.3% of a thread (the first of each file aside).
  uint64_t symbol_pass_spacing_all = 300;
};

// What the overhead budget needs of a process: its probe hits so far (observed, not scaled).
struct ProbeHits {
  uint64_t entries = 0;  // uprobe hits
  uint64_t returns = 0;  // uretprobe hits (costlier)
  // Of those, the hits of high-rate probes (the ones the budget switches).
  uint64_t high_rate_entries = 0;
  uint64_t high_rate_returns = 0;
};

// One process's profiles for one window, ready for pprof.
struct ProcessProfile {
  uint32_t pid = 0;
  std::string comm;
  Labels labels;  // pid, comm, container_id, pod, namespace
  uint64_t from_unix_ns = 0, until_unix_ns = 0;
  report::FlameData cpu, launches;  // empty stacks: nothing in the window
};

class Aggregator final : public store::EventSink {
 public:
  // cpu_profile_hz: the CPU sampling rate (a sample's weight in nanoseconds); `host_root` is
  // where the host's / is (for container runtimes' state; tests point it elsewhere); `clock`:
  // CLOCK_MONOTONIC's now, in ns (tests drive their own).
  Aggregator(const AggregatorLimits& limits, int cpu_profile_hz, std::string host_root = "/",
             std::function<uint64_t()> clock = {});

  // store::EventSink
  void set_meta(const std::string& key, const std::string& value) override;
  void add_gpu(const gpu::GpuDevice& d) override;
  void add_call(const CallEvent& e) override;
  int64_t intern_kernel(const std::string& name, const std::string& demangled) override;
  int64_t intern_module(const std::string& path, const std::string& build_id) override;
  int64_t intern_stack(const std::vector<store::StoredFrame>& frames) override;
  int64_t intern_python_frame(const std::string& function, const std::string& file, int line) override;
  void upsert_process(uint32_t pid, uint32_t ppid, const std::string& comm, const std::string& cmdline,
                      const std::string& exe, uint64_t ts_ns) override;
  void set_process_exit(uint32_t pid, uint64_t ts_ns, int exit_code) override;
  void upsert_thread(uint32_t, uint32_t, const std::string&) override {}
  void add_library(const store::LibraryRow& lib) override;
  void add_sample(uint64_t ts_ns, uint32_t pid, uint32_t tid, uint32_t cpu, int64_t stack_id,
                  int64_t kernel_stack_id) override;
  void add_thread_time(const store::ThreadTimeRow& r) override {
    if (live_) live_->add_thread_time(r);
  }
  // Calls and host telemetry are also given to the live diagnosis (set before tracing starts).
  void set_live_diagnosis(LiveDiagnosis* live) { live_ = live; }
  void add_symbol(int64_t module_id, uint64_t offset, const std::string& name) override;
  void set_lost(const std::string& cause, uint64_t count) override;
  void add_gpu_batch(const gpu::NvmlSampler::Batch& b) override;
  void add_pressure(const host::PressureReading& r) override;
  void commit() override {}
  uint64_t stack_epoch() const override { return stack_epoch_.load(std::memory_order_relaxed); }

  // The budget's duty cycle of a process's high-rate probes (launches, copies, memsets), as it
  // happened: taken on at `t_ns` (probes off; `at_start`: at its first CUDA library's load, see
  // ObservedCycles::found), switched on (once attaching returned) and off
  // (as detaching began; `probe_share`: what they cost the process's CPU while on), and let go
  // (it exited by `t_ns`). The calls of each cycle are weighed from these times
  // (observed_cycles.h), in the clock of the calls' timestamps (CLOCK_MONOTONIC).
  void high_rate_found(uint32_t pid, uint64_t t_ns, bool at_start = false);
  void high_rate_switched_on(uint32_t pid, uint64_t t_ns);
  void high_rate_switched_off(uint32_t pid, uint64_t t_ns, double probe_share);
  void high_rate_let_go(uint32_t pid, uint64_t t_ns);
  // A process whose high-rate calls are observed at a fixed share by other means than the duty
  // cycle above (no switch times given): each counts `weight`, and its series state
  // `observed_ratio` (and are estimates unless it is 1).
  void set_high_rate_weight(uint32_t pid, double weight, double observed_ratio);
  // Observed high-rate calls of all processes since start (not scaled): what the agent's own
  // work on them grows with.
  uint64_t high_rate_calls_seen() const;
  std::map<uint32_t, ProbeHits> probe_hits() const;
  // The high-rate functions (cuda::FunctionSpec ids) the process was seen calling, driver calls
  // made inside runtime calls included: what its probes must cover between full on-periods.
  std::set<uint16_t> high_rate_functions(uint32_t pid) const;
  // The process's labels (empty if unknown).
  Labels labels_of(uint32_t pid) const;

  // Per-process and per-GPU families; `extra` (the agent's own health, the budget's figures)
  // is appended. Exited processes are dropped after the snapshot that follows their exit.
  MetricSnapshot snapshot(std::vector<MetricFamily> extra, uint64_t start_unix_ns);
  // Each process's stacks since the last call; the window restarts. Named; or kept unnamed
  // (nobody asked for it yet; naming is most of what profiles cost), its stacks' frames copied,
  // until name_unnamed() or the next take; or dropped (the memory limit).
  enum class Take { Named, Kept, Dropped };
  std::vector<ProcessProfile> take_profiles(Take how = Take::Named);
  // The window the last take_profiles(Take::Kept) kept, named now; nullopt if there is none.
  std::optional<std::vector<ProcessProfile>> name_unnamed();

  struct Shed {
    uint64_t kernel_names = 0, stacks = 0, processes = 0, allocations = 0;
    uint64_t frame_names = 0;  // profile frames left file+offset for a window (a symbol pass put off)
  };
  Shed shed() const;
  uint64_t lost_total() const;
  std::map<std::string, uint64_t> lost() const;

 private:
  struct CallTotals {
    double count = 0, seconds = 0;
  };
  struct Allocation {
    uint64_t size;
    bool pinned_host;
  };
  struct Process {
    uint32_t pid = 0;
    std::string comm;
    discover::ContainerInfo container;
    bool exited = false, reported_exit = false;
    HighRateCounts high;     // launches and copies, scaled: what the counters export
    ObservedCycles cycles;   // the duty cycle, when the budget reports it
    double high_rate_weight = 1, observed_ratio = 1;  // set_high_rate_weight's, otherwise
    double allocations = 0, allocated_bytes = 0, freed_bytes = 0, allocation_failures = 0;
    std::unordered_map<uint64_t, Allocation> live;
    double device_in_use = 0, pinned_in_use = 0;
    std::map<uint16_t, CallTotals> syncs;  // function id
    std::map<uint16_t, double> errors;     // function id -> calls that returned an error
    ProbeHits hits;
    std::set<uint16_t> high_rate_functions;
    NcclCounters nccl;
    std::unordered_map<int64_t, int64_t> cpu_window, launch_window;  // stack id -> weight
    uint64_t window_start_unix_ns = 0;
    Labels labels() const;
  };
  struct GpuLatest {
    gpu::GpuDevice device;
    gpu::GpuSample sample;
    std::map<uint64_t, double> xids;  // xid -> count
  };

  Process* process(uint32_t pid);  // created on first sight; null past max_processes
  // The key a launch of `kernel` counts under: HighRateCounts::kOtherKernel past max_kernel_names.
  int64_t launch_key(Process& p, int64_t kernel);
  struct PendingFrame;
  // A window taken: each process's stack weights, with the frames of its stacks and the Python
  // frames in them copied, so that it can be named after the tables have been emptied.
  struct TakenWindow {
    ProcessProfile prof;
    std::unordered_map<int64_t, int64_t> cpu, launches;
  };
  struct TakenProfiles {
    std::vector<TakenWindow> windows;
    std::unordered_map<int64_t, std::pair<uint32_t, std::vector<store::StoredFrame>>> stacks;  // id -> (pid, frames)
    std::unordered_map<int64_t, report::PythonFrameRow> python;
  };
  // Both with profile_mu_ held.
  void forget_names_of_old_stacks();
  std::vector<ProcessProfile> name_windows(TakenProfiles t);
  std::vector<PendingFrame> pending_frames(uint32_t pid, const std::vector<store::StoredFrame>& frames,
                                           const std::unordered_map<int64_t, report::PythonFrameRow>& python_rows) const;
  std::optional<TakenProfiles> unnamed_;  // guarded by profile_mu_

  AggregatorLimits limits_;
  int cpu_profile_hz_;
  std::string host_root_;
  std::function<uint64_t()> clock_;
  mutable std::mutex mu_;
  uint64_t high_rate_calls_seen_ = 0;
  std::unordered_map<uint32_t, Process> processes_;
  std::vector<std::string> kernel_names_;  // id - 1 -> label
  std::unordered_map<std::string, int64_t> kernel_ids_;
  struct Module {
    std::string path, build_id;
  };
  std::vector<Module> modules_;  // id - 1
  std::map<std::pair<int64_t, uint64_t>, std::string> symbols_;  // recorded names
  // Stacks and Python frames, emptied together (a new epoch) once the table is half full.
  // Ids are never reused, so that one handed out before is simply not found after.
  std::unordered_map<int64_t, std::vector<store::StoredFrame>> stacks_;
  std::unordered_map<std::string, int64_t> stack_ids_;  // frames' bytes -> id
  std::unordered_map<int64_t, std::string> kernel_activity_;  // kernel stack id -> what it was doing
  std::unordered_map<int64_t, report::PythonFrameRow> python_frames_;
  std::unordered_map<std::string, int64_t> python_ids_;
  int64_t next_stack_id_ = 1, next_python_id_ = 1;
  std::mutex profile_mu_;  // take_profiles; guards names_cache_
  std::unordered_map<int64_t, std::vector<std::string>> names_cache_;  // stack id -> names, outermost first
  uint64_t names_epoch_ = 0;
  // Native frames named before, by (module id, offset): stacks share most of their frames, and
  // with Python's in them at 100 Hz the stack table fills and is emptied about every window, and
  // names_cache_ with it (naming every frame of every stack again was half the agent's exporter
  // thread beside a PyTorch job). Guarded by profile_mu_; at most kMaxFrameNames.
  static constexpr size_t kMaxFrameNames = 100000;
  static uint64_t frame_key(int64_t module_id, uint64_t offset);  // 0: not kept
  std::unordered_map<uint64_t, std::string> frame_names_;
  // Python frames labelled before, by their id (ids are not reused), until the stack table is
  // emptied: a frame is in many stacks, and its label took a format each time. Guarded by
  // profile_mu_.
  struct PythonLabel {
    std::string name, file;
    int64_t line = 0;
  };
  std::unordered_map<int64_t, PythonLabel> python_labels_;
  // Functions named before, kept across windows so that a new stack through known functions
  // (CPU samples land at ever new offsets in the same hot ones) costs no pass over a library's
  // symbols. By (file, build id): start offset -> (end, name); offsets in no function are kept
  // as an empty name over [offset, offset + 1). At most kMaxKnownFunctions in all.
  static constexpr size_t kMaxKnownFunctions = 20000;
  std::map<std::pair<std::string, std::string>, std::map<uint64_t, std::pair<uint64_t, std::string>>> known_functions_;
  size_t known_function_count_ = 0;
  // A pass over libtorch's symbols costs tens of milliseconds, and frame-pointer walks through
  // code built without frame pointers give ever new (garbage) offsets in it: so a file's next
  // pass waits limits_.symbol_pass_spacing times as long as its last one took (by default,
  // passes over one file use at most ~1% of a thread), and never more than kSymbolPassMaxWaitNs.
  // A small executable's pass (well under a millisecond) is hardly put off. Offsets met while a
  // pass waits that no known function covers are named file+offset in that window, their
  // stacks named again in the next one.
  static constexpr uint64_t kSymbolPassMaxWaitNs = 60'000'000'000;
  struct SymbolPass {
    uint64_t at_ns = 0;
    uint64_t cost_ns = 0;
  };
  std::map<std::pair<std::string, std::string>, SymbolPass> last_symbol_pass_;
  // The same over every file together (a PyTorch process samples in a dozen large libraries):
  // after each pass but a file's first, none until limits_.symbol_pass_spacing_all times its
  // cost has gone by.
  uint64_t next_symbol_pass_ns_ = 0;
  std::atomic<uint64_t> deferred_frames_{0};  // named file+offset while their file's pass waited
  std::atomic<uint64_t> stack_epoch_{0};
  int64_t python_module_ = 0;
  LiveDiagnosis* live_ = nullptr;
  std::map<uint32_t, GpuLatest> gpus_;
  std::map<std::pair<uint32_t, uint32_t>, gpu::GpuProcessSample> gpu_processes_;  // (gpu, pid)
  std::map<std::string, uint64_t> lost_;
  Shed shed_;
};

// A kernel's name as a label: the demangled name without its parameter list, at most 160
// characters (PyTorch's template names run to thousands).
std::string kernel_label(const std::string& demangled);

}  // namespace gpuscope::agent
