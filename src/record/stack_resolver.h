// Turns the stacks records name into the sink's stack ids: user stacks walked in BPF
// (GS_REC_NATIVE_STACK) or sent as a copy of the stack and unwound here (GS_REC_STACK_COPY,
// samples' copies), Python frames merged in place of the eval loop that ran them, kernel stacks
// from the BPF stack maps, and worker threads' stacks stored below the call that handed them
// work (record::Stitcher). It owns every cache of these, each bounded, and reaches the kernel
// only through StackMaps. Pipeline thread only, except where said.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "events.h"
#include "record/build_ids.h"
#include "record/process_lifetime.h"
#include "record/stack_generations.h"
#include "record/stack_maps.h"
#include "record/stitcher.h"
#include "store/sink.h"
#include "symbolize/dwarf_unwinder.h"
#include "symbolize/kallsyms.h"
#include "symbolize/process_maps.h"
#include "symbolize/python_frames.h"

namespace gpuscope::record {

struct StackStats {
  uint64_t stack_recycles = 0;
  // Kernel stacks captured before their map was emptied (samples in flight across a recycle): unread.
  uint64_t stacks_expired = 0;
  // Times the Python stacks held were started anew (and the BPF side made to send them again).
  uint64_t python_stack_generations = 0;
  // Handoffs seen (cuda/handoffs.h), and calls and samples stored below one.
  uint64_t handoffs = 0;
  uint64_t stitched = 0;
  // Pieces of stack copies the BPF side could not read (a page not mapped at the probe), read
  // from the live stack here, or taken as zeros (the process was gone).
  uint64_t copy_holes_read = 0;
  uint64_t copy_holes_zeroed = 0;
};

class StackResolver {
 public:
  // recycle_stacks_at: see PipelineConfig.
  StackResolver(store::EventSink& sink, StackMaps& kernel, symbolize::ProcessMaps& maps, BuildIds& build_ids,
                double recycle_stacks_at);

  // Forgets each process's stacks at its exit, and what its addresses meant at its exec.
  void subscribe(ProcessLifetime& lifetime);

  // Any thread.
  void add_python_process(pid_t pid, const discover::PythonProcess& p) { python_.add_process(pid, p); }
  // Where a handoff's worker functions are (file offsets) in the file with this build id (or,
  // without one, this path as processes map it): stacks with a frame there ran on a worker thread.
  struct WorkerRange {
    uint64_t start, end;
    uint16_t handoff;
  };
  void add_handoff_workers(const std::string& build_id, const std::string& path, std::vector<WorkerRange> ranges);
  // The key of worker_ranges_: the build id, or without one the path.
  static std::string worker_file_key(const std::string& build_id, const std::string& path);

  // Called with the frames of each call's stack that came as a copy and was unwound here (the
  // eh-frame walker's fallback while a table it needs is being made): the files they are in are
  // the ones its walks need. Set before the first record.
  using CopyUnwound = std::function<void(uint32_t pid, const std::vector<uint64_t>& ips)>;
  void on_copy_unwound(CopyUnwound f) { copy_unwound_ = std::move(f); }

  // Before each batch of records: applies new worker ranges, and follows the sink's stack epoch.
  void begin_batch();
  // The latest call or sample seen (for when Python stacks may be forgotten).
  void note_time(uint64_t ts_ns) { newest_ts_ns_ = std::max(newest_ts_ns_, ts_ns); }

  // Records that carry stacks ahead of the records naming them. Sizes are checked here.
  void on_stack_copy(const uint8_t* data, size_t size);
  void on_native_stack(const uint8_t* data, size_t size);
  void on_python_code(const gs_py_code_record& rec) { python_.on_code(rec); }
  void on_python_stack(const uint8_t* data, size_t size);
  void on_fork(uint32_t parent, uint32_t child) { python_.on_fork(pid_t(parent), pid_t(child)); }
  // A handoff's entry: its stack, for the Stitcher; no call is stored.
  void on_handoff(const gs_call_record& rec);

  // A call's user stack as its record names it (a copy sent ahead, or a walk in BPF); 0: none.
  int64_t call_stack(const gs_call_record& rec, uint64_t py_stack);
  // When the call is stored: its Python frames alone if it has no other stack, and the whole
  // stitched below a handoff's caller when a worker thread made it.
  int64_t finish_call_stack(uint32_t pid, uint32_t tid, int64_t stack_id, uint64_t py_stack);
  // A CPU sample's user stack (stitched) and kernel stack. `data`: the whole record.
  struct SampleStacks {
    int64_t user = 0, kernel = 0;
  };
  SampleStacks sample_stacks(const gs_sample_record& rec, const uint8_t* data, size_t size);

  // After each round of batches: switches the kernel-stack maps when full enough, and empties the
  // old one once no record on its way can name it. `taken_ns`: when that work left the queue.
  void recycle(uint64_t taken_ns);

  // Any thread.
  StackStats stats() const;
  // Lost counters: (cause, count), for the sink.
  std::vector<std::pair<const char*, uint64_t>> lost();

 private:
  struct Unwound {
    std::vector<uint64_t> ips;
    bool truncated = false;
  };
  void forget_process(uint32_t pid);
  void forget_program(uint32_t pid);
  // A stack of Python frames alone (a call or sample whose native stack was not taken).
  int64_t python_only_stack(uint32_t pid, uint64_t py_stack);
  // thread_handoff (here and below): the handoff whose worker the thread is by its name (handoff_thread), 0: none.
  int64_t take_sent_stack(uint32_t pid, uint32_t tid, uint64_t ts_ns, uint64_t py_stack, uint16_t thread_handoff);
  // A stack walked from the unwind tables in BPF, by the id its GS_REC_NATIVE_STACK came with.
  int64_t native_stack(uint32_t pid, uint64_t id, uint64_t py_stack, uint16_t thread_handoff);
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
  store::StoredFrame handoff_separator(uint16_t handoff);
  // The outermost frame of a walk cut short: "[truncated stack]".
  store::StoredFrame truncated_frame();
  // Every stack id cached here is forgotten (the sink's are void, or the Stitcher's were dropped).
  void forget_stored_stacks();
  // A stack sent as registers and a copy of its top (samples, --call-stacks dwarf), unwound.
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
  int64_t kernel_stack(int32_t bpf_stack_id, uint64_t ts_ns);
  bool stack_expired(int32_t bpf_stack_id, uint64_t ts_ns);

  store::EventSink& sink_;
  StackMaps& kernel_;
  symbolize::ProcessMaps& maps_;
  BuildIds& build_ids_;

  std::mutex mu_;  // new_worker_ranges_
  std::vector<std::pair<std::string, std::vector<WorkerRange>>> new_worker_ranges_;

  // Python stack id -> stored (python_only_stack), per process.
  std::unordered_map<uint32_t, std::unordered_map<uint64_t, int64_t>> stack_ids_;
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
    // In libgpuscope_launches.so (record --launch-probes in-process): the hooks' own frames atop
    // a launch's stack are left out, the stack starting where the program called the driver.
    bool hooks = false;
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
  uint64_t stack_epoch_ = 0;  // the sink's, when the caches of stored stacks were filled
  std::unique_ptr<symbolize::Kallsyms> kallsyms_;  // read at the first kernel stack
  CopyUnwound copy_unwound_;
  symbolize::DwarfUnwinder unwinder_;  // stacks sent as copies (samples, --call-stacks dwarf)
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
  uint64_t newest_ts_ns_ = 0;         // the latest call or sample processed
  uint64_t python_forgotten_ns_ = 0;  // when the BPF side last forgot the Python stacks sent
  static constexpr size_t kMaxPyFrameIds = 1 << 16;
  std::vector<PyFrameId> py_frames_scratch_;
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
  // (native stack id, Python stack id): both are hashes already.
  struct StackPairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& k) const { return k.first ^ (k.second * 0x9e3779b97f4a7c15ull); }
  };
  struct NativeStacks {
    std::unordered_map<uint64_t, Unwound> stacks;
    // Looked up at every call and sample: a hash (a tree of tens of thousands was the agent's
    // pipeline's largest single cost beside a Python job sampled at 100 Hz).
    std::unordered_map<std::pair<uint64_t, uint64_t>, int64_t, StackPairHash> stored;
    // Samples' stacks (sent with each sample) stored before, by (id, Python stack): a hot
    // loop's samples repeat a few stacks, resolved once. Emptied when full.
    std::unordered_map<std::pair<uint64_t, uint64_t>, int64_t, StackPairHash> once_stored;
  };
  static constexpr size_t kMaxOnceStoredPerProcess = 16384;
  std::unordered_map<uint32_t, NativeStacks> native_stacks_;
  // Stacks sent for one record each (GS_NATIVE_ONCE: CPU samples'), by id, until it comes.
  static constexpr size_t kMaxOnceStacks = 4096;
  std::unordered_map<uint64_t, Unwound> once_stacks_;
  uint64_t native_stacks_unknown_ = 0;  // records naming a stack that never came (or was dropped)
  std::unordered_set<uint64_t> named_kernel_ips_;
  StackGenerations stack_gens_;
  // Worker functions' ranges by file (build id, or "path:" and the path), sorted by start.
  std::unordered_map<std::string, std::vector<WorkerRange>> worker_ranges_;
  Stitcher stitcher_;
  int64_t handoff_module_id_ = 0;
  std::unordered_set<uint16_t> handoff_labels_named_;
  std::vector<uint16_t> handoffs_probed_;  // those add_handoff_workers was given
  std::vector<uint8_t> filled_copy_;       // a copy with its holes filled

  std::atomic<uint64_t> stack_recycles_{0}, stacks_expired_{0}, python_generations_{0}, handoffs_{0},
      stitched_{0}, copy_holes_read_{0}, copy_holes_zeroed_{0};
};

}  // namespace gpuscope::record
