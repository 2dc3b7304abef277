// The stage between the ring buffer and the record file. The ring-buffer thread only copies
// records into batches (push/end_batch never block); a pipeline thread decodes them, resolves
// stacks and kernel names, and writes them. Memory is bounded: past `max_queued_bytes` of
// buffers queued, whole batches are dropped and counted as lost (the pipeline thread holds as
// much again while it works through the batches it took).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "attach/bpf_session.h"
#include "decode/tracker.h"
#include "record/stack_generations.h"
#include "record/stitcher.h"
#include "store/sink.h"
#include "symbolize/dwarf_unwinder.h"
#include "symbolize/kallsyms.h"
#include "symbolize/process_maps.h"
#include "symbolize/python_frames.h"
#include "symbolize/symbolizer.h"

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
};

struct PipelineStats {
  uint64_t records = 0;
  uint64_t calls = 0;
  uint64_t launches = 0;
  uint64_t samples = 0;
  uint64_t queue_dropped_records = 0;
  uint64_t stack_recycles = 0;
  // Kernel stacks captured before their map was emptied (samples in flight across a recycle): unread.
  uint64_t stacks_expired = 0;
  // Times the Python stacks held were started anew (and the BPF side made to send them again).
  uint64_t python_stack_generations = 0;
  // Handoffs seen (decode/handoffs.h), and calls and samples stored below one.
  uint64_t handoffs = 0;
  uint64_t stitched = 0;
  // Pieces of stack copies the BPF side could not read (a page not mapped at the probe), read
  // from the live stack here, or taken as zeros (the process was gone).
  uint64_t copy_holes_read = 0;
  uint64_t copy_holes_zeroed = 0;
};

class Pipeline {
 public:
  Pipeline(store::EventSink& sink, attach::BpfSession& bpf, symbolize::ProcessMaps& maps,
           const PipelineConfig& cfg);
  ~Pipeline();

  // Ring-buffer thread.
  void push(const void* data, size_t size);
  void end_batch();

  // A library gpuscope attached to (or failed to); written on the pipeline thread.
  void add_library(store::LibraryRow row);
  // One NVML sampler tick (any thread); written on the pipeline thread.
  void add_gpu_batch(gpu::NvmlSampler::Batch&& b);
  // A process running an interpreter whose frames the BPF side walks (any thread).
  void add_python_process(pid_t pid, const discover::PythonProcess& p) { python_.add_process(pid, p); }
  // The process is followed from before its first CUDA call (see decode::Tracker); any thread.
  void mark_complete_history(pid_t pid);
  // The process's driver probes were all in place from ts_ns on (decode::Tracker); any thread.
  void note_driver_probed(pid_t pid, uint64_t ts_ns);
  // Where handoff `handoff`'s worker functions are (file offsets) in the file with this build id
  // (or, without one, this path as processes map it): stacks with a frame there ran on a worker
  // thread and are stored below the handoff's caller (record::Stitcher). Any thread.
  struct WorkerRange {
    uint64_t start, end;
    uint16_t handoff;
  };
  void add_handoff_workers(const std::string& build_id, const std::string& path, std::vector<WorkerRange> ranges);
  // The key of worker_ranges_: the build id, or without one the path.
  static std::string worker_file_key(const std::string& build_id, const std::string& path);

  // Called on the pipeline thread with the frames of each call's stack that came as a copy and
  // was unwound here (the eh-frame walker's fallback while a table it needs is being made): the
  // files they are in are the ones its walks need. Set before start().
  using CopyUnwound = std::function<void(uint32_t pid, const std::vector<uint64_t>& ips)>;
  void on_copy_unwound(CopyUnwound f) { copy_unwound_ = std::move(f); }

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
  void emit(CallEvent& e);
  // comm_seen: its name as a record saw it, for a process gone before /proc could be read.
  void note_process(uint32_t pid, uint64_t ts_ns, const std::string& comm_seen = {});
  void note_thread(uint32_t tid, uint32_t pid, const std::string& comm);
  // ts_ns: the record's, taken before its stacks were captured (see StackGenerations::expired).
  // A stack of Python frames alone (a call or sample whose native stack was not taken).
  int64_t python_only_stack(uint32_t pid, uint64_t py_stack);
  static bool is_registration(const CallEvent& e);
  // thread_handoff (here and below): the handoff whose worker the thread is by its name (handoff_thread), 0: none.
  int64_t take_sent_stack(uint32_t pid, uint32_t tid, uint64_t ts_ns, uint64_t py_stack, uint16_t thread_handoff);
  // A stack walked from the unwind tables in BPF, by the id its GS_REC_NATIVE_STACK came with.
  int64_t native_stack(uint32_t pid, uint64_t id, uint64_t py_stack, uint16_t thread_handoff);
  void on_native_stack(const uint8_t* data, size_t size);
  // Forgets a process's native stacks here and in BPF's sent map, which then sends them again.
  void forget_native_stacks(uint32_t pid);
  // Stores a native stack (innermost first) merged with the thread's Python stack, if any; a
  // native walk cut short gets its truncation marker.
  int64_t store_user_stack(uint32_t pid, const std::vector<uint64_t>& ips, bool truncated, uint64_t py_stack,
                           uint16_t thread_handoff = 0);
  // The handoff whose worker a thread of this name is (HandoffSpec::thread_name), 0: none.
  uint16_t handoff_thread(const char* comm, size_t len) const;
  // The frames store_user_stack stores; `handoff`: the handoff whose worker thread ran it, 0: none.
  std::vector<store::StoredFrame> user_stack_frames(uint32_t pid, const std::vector<uint64_t>& ips, bool truncated,
                                                    uint64_t py_stack, uint16_t& handoff);
  // A handoff's entry (decode/handoffs.h): its stack, for the Stitcher; no call is stored.
  void on_handoff(const gs_call_record& rec);
  store::StoredFrame handoff_separator(uint16_t handoff);
  // The outermost frame of a walk cut short: "[truncated stack]".
  store::StoredFrame truncated_frame();
  // Every stack id cached here is forgotten (the sink's are void, or the Stitcher's were dropped).
  void forget_stored_stacks();
  // A stack sent as registers and a copy of its top (samples, --call-stacks dwarf), unwound.
  struct Unwound {
    std::vector<uint64_t> ips;
    bool truncated = false;
  };
  // regs_in_record: a gs_user_regs, unaligned (copied out).
  Unwound unwind_stack_copy(uint32_t pid, uint32_t tid, const uint8_t* regs_in_record, const uint8_t* stack,
                            uint32_t len, uint16_t holes);
  struct PyFrameId {
    int64_t id;  // the sink's python frame
    bool entry;  // the outermost frame of one C call into the interpreter
  };
  // A sent Python stack's frames as the sink's ids, innermost first (empty: none arrived).
  void python_frame_ids(uint64_t py_stack, std::vector<PyFrameId>& out);
  // Python frames take the place of the eval-loop frames that ran them (see python_frames.h).
  void merge_python(std::vector<store::StoredFrame>& native, const std::vector<bool>& eval_loop,
                    uint64_t py_stack);
  // Kernel stacks are the same in every process: cached once, frames named from kallsyms.
  int64_t resolve_kernel_stack(int32_t bpf_stack_id, uint64_t ts_ns);
  // Switches the BPF side to the other stack map when the current one is full enough, and
  // empties the old one once no record on its way can name it. `taken_ns`: when the work just
  // processed was taken from the queue.
  void recycle_stacks(uint64_t taken_ns);
  bool stack_expired(int32_t bpf_stack_id, uint64_t ts_ns);
  int64_t resolve_kernel(const CallEvent& e);
  const std::string& build_id_of(uint32_t pid, const symbolize::ModuleAddress& m);
  // A name in the target's memory (or, once it is gone, its file); `partial` if neither reads.
  std::string read_name(uint32_t pid, uint64_t addr, const std::string& partial);
  void write_lost();
  void maybe_commit();

  store::EventSink& sink_;
  attach::BpfSession& bpf_;
  symbolize::ProcessMaps& maps_;
  symbolize::Symbolizer symbolizer_;
  PipelineConfig cfg_;
  decode::Tracker tracker_;

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
  std::vector<uint32_t> complete_history_marks_;
  std::vector<std::pair<uint32_t, uint64_t>> driver_probed_marks_;  // (pid, ts_ns)
  std::vector<uint16_t> redundant_runtime_;
  std::vector<std::pair<std::string, std::vector<WorkerRange>>> new_worker_ranges_;
  size_t queued_bytes_ = 0;
  bool stopping_ = false;
  std::thread thread_;

  // Pipeline thread side.
  std::unordered_set<uint32_t> known_processes_;
  static constexpr size_t kMaxThreadComms = 65536;
  std::unordered_map<uint32_t, std::string> thread_comms_;
  // Per process, forgotten at its exit: a later process may reuse the pid with other mappings.
  // Python stack id -> stored (python_only_stack)
  std::unordered_map<uint32_t, std::unordered_map<uint64_t, int64_t>> stack_ids_;
  // Build ids by process (dropped at its exit: the paths go through its /proc/PID/root), then
  // by the path they were read at.
  std::unordered_map<uint32_t, std::unordered_map<std::string, std::string>> build_ids_;
  std::unordered_map<int32_t, int64_t> kernel_stack_ids_;
  // Where each return address of a process's stacks lies (module, offset, eval loop or not):
  // samples bring the same addresses again and again, and each costs a maps lookup, a build-id
  // lookup and the module's interning. Emptied when any process's maps are read again or the
  // Python processes change (ProcessMaps::reads, PythonFrames::generation), and when full.
  struct ResolvedFrame {
    int64_t module_id = 0;  // 0: in no file; asked again after kUnmappedRetryNs
    uint64_t offset = 0;
    bool eval_loop = false;
    uint16_t handoff_worker = 0;  // in a worker function of this handoff (add_handoff_workers)
    uint64_t asked_ns = 0;
  };
  struct FrameCache {
    uint64_t maps_reads = 0, python_generation = 0;
    std::unordered_map<uint64_t, ResolvedFrame> frames;
  };
  static constexpr size_t kMaxResolvedFrames = 1 << 16;  // per process
  static constexpr uint64_t kUnmappedRetryNs = 1'000'000'000;
  std::unordered_map<uint32_t, FrameCache> frame_cache_;
  const ResolvedFrame& resolve_frame(uint32_t pid, uint64_t ip);
  uint64_t stack_epoch_ = 0;  // the sink's, when the two caches above were filled
  std::unique_ptr<symbolize::Kallsyms> kallsyms_;  // read at the first kernel stack
  CopyUnwound copy_unwound_;
  symbolize::DwarfUnwinder unwinder_;               // stacks sent as copies (samples, --call-stacks dwarf)
  int64_t kernel_module_id_ = 0;
  int64_t truncated_module_id_ = 0;
  int64_t python_module_id_ = 0;
  symbolize::PythonFrames python_;
  // Python stacks held per generation (PythonFrames::new_generation): ~0.7 KiB each at 40
  // frames, so two generations stay within a few MiB.
  static constexpr size_t kMaxPythonStacks = 4096;
  // (process, code object | entry bit, instruction) -> the sink's python frame id.
  struct PyFrameKey {
    uint32_t pid;
    uint64_t code, instr;
    bool operator==(const PyFrameKey&) const = default;
  };
  struct PyFrameKeyHash {
    size_t operator()(const PyFrameKey& k) const {
      return std::hash<uint64_t>()(k.code * 0x9e3779b97f4a7c15ull ^ k.instr ^ (uint64_t(k.pid) << 40));
    }
  };
  std::unordered_map<PyFrameKey, int64_t, PyFrameKeyHash> py_frame_ids_;
  uint64_t py_frame_ids_generation_ = 0;
  uint64_t newest_ts_ns_ = 0;        // the latest call or sample processed
  uint64_t python_forgotten_ns_ = 0;  // when the BPF side last forgot the Python stacks sent
  static constexpr size_t kMaxPyFrameIds = 1 << 16;
  std::vector<PyFrameId> py_frames_scratch_;
  std::atomic<uint64_t> python_generations_{0};
  // Stacks sent ahead of their record (copies with --call-stacks dwarf), by (tid, the record's
  // time); stored when that record, with its Python stack, comes.
  static constexpr size_t kMaxCopiedStacks = 65536;
  std::map<std::pair<uint32_t, uint64_t>, Unwound> copied_stacks_;
  // Stacks that came ahead, stored: by process, then by their frames, Python stack and
  // truncation (bytes), so that one sent again is not resolved and interned again.
  static constexpr size_t kMaxSentStacksPerProcess = 16384;
  std::unordered_map<uint32_t, std::unordered_map<std::string, int64_t>> sent_stack_ids_;
  // Stacks walked in BPF (GS_REC_NATIVE_STACK), by process and id; and those stored, by (id,
  // Python stack). Dropped at the process's exit or exec, or once a process has too many.
  static constexpr size_t kMaxNativeStacksPerProcess = 65536;
  struct NativeStacks {
    std::unordered_map<uint64_t, Unwound> stacks;
    std::map<std::pair<uint64_t, uint64_t>, int64_t> stored;
    // Samples' stacks (sent with each sample) stored before, by (id, Python stack): a hot
    // loop's samples repeat a few stacks, resolved once. Emptied when full.
    std::map<std::pair<uint64_t, uint64_t>, int64_t> once_stored;
  };
  static constexpr size_t kMaxOnceStoredPerProcess = 16384;
  std::unordered_map<uint32_t, NativeStacks> native_stacks_;
  // Stacks sent for one record each (GS_NATIVE_ONCE: CPU samples'), by id, until it comes.
  static constexpr size_t kMaxOnceStacks = 4096;
  std::unordered_map<uint64_t, Unwound> once_stacks_;
  uint64_t native_stacks_unknown_ = 0;  // records naming a stack that never came (or was dropped)
  std::unordered_set<uint64_t> named_kernel_ips_;
  std::unordered_map<uint32_t, std::unordered_map<uint64_t, int64_t>> kernel_ids_;  // handle ^ api -> kernel
  uint64_t calls_since_commit_ = 0;
  uint64_t names_unread_ = 0;
  uint64_t last_commit_ns_ = 0;
  StackGenerations stack_gens_;
  // Worker functions' ranges by file (build id, or "path:" and the path), sorted by start.
  std::unordered_map<std::string, std::vector<WorkerRange>> worker_ranges_;
  Stitcher stitcher_;
  int64_t handoff_module_id_ = 0;
  std::unordered_set<uint16_t> handoff_labels_named_;
  std::vector<uint16_t> handoffs_probed_;  // those add_handoff_workers was given
  std::atomic<uint64_t> handoffs_{0}, stitched_{0};

  std::atomic<uint64_t> records_{0}, calls_{0}, launches_{0}, samples_{0}, dropped_{0}, stack_recycles_{0},
      stacks_expired_{0}, copy_holes_read_{0}, copy_holes_zeroed_{0};
  std::vector<uint8_t> filled_copy_;  // a copy with its holes filled
};

}  // namespace gpuscope::record
