// The stage between the ring buffer and the record file. The ring-buffer thread only copies
// records into batches (push/end_batch never block); a pipeline thread decodes them, resolves
// stacks and kernel names, and writes them. Memory is bounded: past `max_queued_bytes` of
// buffers queued, whole batches are dropped and counted as lost (the pipeline thread holds as
// much again while it works through the batches it took).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "discover/fd_names.h"
#include "host/pressure.h"
#include "attach/bpf_session.h"
#include "decode/tracker.h"
#include "decode/verbs_tracker.h"
#include "gpu/nvml.h"
#include "record/build_ids.h"
#include "record/kernel_names.h"
#include "record/process_lifetime.h"
#include "record/stack_maps.h"
#include "record/stack_resolver.h"
#include "store/sink.h"
#include "symbolize/process_maps.h"

namespace gpuscope::record {

struct PipelineConfig {
  size_t max_queued_bytes = 64u << 20;
  // A batch is handed over at this size even while the ring buffer still has data: under a
  // sustained flood the consumer never finds it empty, and the batch must not grow without end.
  size_t max_batch_bytes = 8u << 20;
  uint64_t commit_interval_ns = 100'000'000;
  uint64_t commit_every_calls = 50'000;
  bool complete_history = true;  // targets followed from their start (see decode::Tracker)
  // Every new program is noted (read from /proc, given to the sink), not only those that make
  // CUDA calls: a recording of the whole host names them all; the agent does not.
  bool note_every_exec = true;
  // Kernel registrations' names (too long for the record's copy) are read from the process
  // only when the kernel is first launched, not at the registration: the calls' rows then
  // lack the names of registered kernels, which the agent does not keep anyway.
  bool lazy_registration_names = false;
  // Recycle the BPF stack maps once the current generation's is this full (0: never; needs
  // the session's stack_generations). See recycle_stacks.
  double recycle_stacks_at = 0;
  // Developers: every batch of records (and every mark given from other threads) is also written
  // here, for replay_capture (the pipeline's tests replay records captured from real runs).
  std::string capture_path;
};

struct PipelineStats {
  uint64_t records = 0;
  uint64_t calls = 0;
  uint64_t launches = 0;
  uint64_t samples = 0;
  uint64_t queue_dropped_records = 0;
  StackStats stacks;
  uint64_t thread_times = 0;  // host telemetry's windows
  // Large heap blocks the heap hooks did not hand over (their rate limit, their table full).
  uint64_t heap_allocs_unrecorded = 0;
};

class Pipeline {
 public:
  // bpf_lost: the BPF side's lost counters, read at each commit.
  Pipeline(store::EventSink& sink, StackMaps& stack_maps, std::function<attach::LostCounts()> bpf_lost,
           symbolize::ProcessMaps& maps, const PipelineConfig& cfg);
  ~Pipeline();

  // Ring-buffer thread.
  void push(const void* data, size_t size);
  void end_batch();
  // Records the control loop must hear of at once (library loads, execs, exits), from the
  // ring-buffer thread, before they are queued (a library load is not queued). Set before start().
  using ControlRecord = std::function<void(uint16_t kind, const void* data)>;
  void on_control_record(ControlRecord f) { control_record_ = std::move(f); }

  // A library gpuscope attached to (or failed to); written on the pipeline thread.
  void add_library(store::LibraryRow row);
  // One NVML sampler tick (any thread); written on the pipeline thread.
  void add_gpu_batch(gpu::NvmlSampler::Batch&& b);
  void add_pressure(std::vector<host::PressureReading>&& readings);  // from the pressure sampler's thread
  // The process is followed from before its first CUDA call (see decode::Tracker); any thread.
  void mark_complete_history(pid_t pid);
  // The process's driver probes were all in place from ts_ns on (decode::Tracker); any thread.
  void note_driver_probed(pid_t pid, uint64_t ts_ns);
  // Stacks: Python processes, handoffs' workers, copies unwound (see StackResolver).
  StackResolver& stacks() { return stacks_; }

  // Runtime functions whose probes only add traps (decode::Tracker::take_redundant_runtime_functions),
  // each returned once; any thread.
  std::vector<uint16_t> take_redundant_runtime_functions();

  void start();
  // Processes everything queued, flushes held calls, writes the lost counters, and joins.
  void stop();
  PipelineStats stats() const;

 private:
  void run();
  void process_batch(const std::vector<uint8_t>& batch);
  void process_record(const uint8_t* data, size_t size);
  // One handler per kind of record (kRoutes in pipeline.cpp); the record is at least as long as
  // the route says.
  void on_call(const uint8_t* data, size_t size);
  void on_stack_copy(const uint8_t* data, size_t size);
  void on_python_code(const uint8_t* data, size_t size);
  void on_python_stack(const uint8_t* data, size_t size);
  void on_native_stack(const uint8_t* data, size_t size);
  void on_fork(const uint8_t* data, size_t size);
  void on_sample(const uint8_t* data, size_t size);
  void on_host_alloc(const uint8_t* data, size_t size);
  void on_thread_time(const uint8_t* data, size_t size);
  void on_verbs(const uint8_t* data, size_t size);  // RDMA verbs (decode/verbs, decode/verbs_tracker)
  void on_function_name(const uint8_t* data, size_t size);
  void on_exit(const uint8_t* data, size_t size);
  void on_exec(const uint8_t* data, size_t size);
  struct Route;
  static const Route* route_of(uint16_t kind);

  void emit(CallEvent& e);
  // comm_seen: its name as a record saw it, for a process gone before /proc could be read.
  void note_process(uint32_t pid, uint64_t ts_ns, const std::string& comm_seen = {});
  void note_thread(uint32_t tid, uint32_t pid, const std::string& comm);
  void write_lost();
  void maybe_commit();

  store::EventSink& sink_;
  std::function<attach::LostCounts()> bpf_lost_;
  symbolize::ProcessMaps& maps_;
  PipelineConfig cfg_;
  decode::Tracker tracker_;
  decode::VerbsTracker verbs_;
  // Per-process state on this thread, let go of at the process's exit or exec.
  ProcessLifetime lifetime_;
  BuildIds build_ids_;
  StackResolver stacks_;
  KernelNames kernel_names_;
  ControlRecord control_record_;
  // --capture-records: every batch and mark, as replay_capture reads them (ring-buffer and
  // control threads; under capture_mu_).
  std::FILE* capture_ = nullptr;
  std::mutex capture_mu_;
  void capture(uint32_t type, const void* data, size_t size);

  // Ring-buffer thread side.
  std::vector<uint8_t> filling_;  // batch_capacity() reserved
  size_t batch_capacity() const;
  static constexpr size_t kMaxSpareBatches = 4;
  std::vector<std::vector<uint8_t>> spare_;  // processed batches' buffers, for end_batch to refill (under mu_)
  uint64_t filling_records_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> queue_;
  std::vector<store::LibraryRow> libraries_;
  std::vector<gpu::NvmlSampler::Batch> gpu_batches_;
  std::vector<host::PressureReading> pressure_;
  std::vector<uint32_t> complete_history_marks_;
  std::vector<std::pair<uint32_t, uint64_t>> driver_probed_marks_;  // (pid, ts_ns)
  std::vector<uint16_t> redundant_runtime_;
  size_t queued_bytes_ = 0;
  bool stopping_ = false;
  std::thread thread_;

  // Pipeline thread side.
  std::unordered_set<uint32_t> known_processes_;
  discover::FdNames fd_names_;  // what threads blocked on (host telemetry)
  static constexpr size_t kMaxThreadComms = 65536;
  std::unordered_map<uint32_t, std::string> thread_comms_;
  uint64_t calls_since_commit_ = 0;
  uint64_t last_commit_ns_ = 0;

  std::atomic<uint64_t> records_{0}, calls_{0}, launches_{0}, samples_{0}, dropped_{0}, thread_times_{0};
  std::atomic<uint64_t> heap_allocs_unrecorded_{0};
};

// Replays a file written with PipelineConfig::capture_path into a pipeline not started: every
// record pushed in its batch, every mark given. Throws gpuscope::Error on a file that is not one.
void replay_capture(const std::string& path, Pipeline& pipeline);

}  // namespace gpuscope::record
