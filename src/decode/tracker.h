// Per-process state that decoding needs across calls: live allocations (to resolve copy
// directions and pinned/pageable host memory), kernel names learnt from registrations and
// lookups, and which driver and runtime calls ran inside which runtime call.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/model.h"
#include "cuda/functions.h"

namespace gpuscope::decode {

class AllocationMap {
 public:
  void add(uint64_t ptr, uint64_t size, cuda::MemKind kind);
  void remove(uint64_t ptr);
  // The kind of the allocation containing addr, MemKind::None if none does.
  cuda::MemKind lookup(uint64_t addr) const;

 private:
  struct Range { uint64_t size; cuda::MemKind kind; };
  std::map<uint64_t, Range> ranges_;
};

class Tracker {
 public:
  // complete_history: the processes were followed from their start, so memory that no
  // tracked allocation contains is pageable, not merely unknown.
  explicit Tracker(bool complete_history) : complete_history_(complete_history) {}

  // Resolves what the call's arguments mean in context and updates the state.
  // Assigns e.call_id. Calls are handed on through `emit`, possibly later than they came in:
  // a driver call is held until the runtime call around it (if any) is known, and so is a
  // runtime call made inside another runtime call (CallEvent::under_runtime: libcudart's
  // cudaMemcpyArrayToArray calls its own cudaMemcpyFromArray and cudaMemcpyToArray). A call's
  // parent is the innermost runtime call around it; calls inside a top-level call without a
  // stack of their own get its stack.
  void process(CallEvent e, const std::function<void(CallEvent&)>& emit);
  // Hands on every held call (end of recording).
  void flush(const std::function<void(CallEvent&)>& emit);
  // Hands on the calls held for the threads of one process (its exit), and only those: a runtime
  // launch held for the driver launch it makes must wait for it whatever other processes do.
  // (Flushed at every exit on the node, a runtime launch went out alone whenever an exit record
  // came between its record and its driver launch's, which then counted as a second launch: 2-5
  // launches too many in 1,007 beside two shell loops of /bin/true and ls on the H100.)
  void flush_process(uint32_t pid, const std::function<void(CallEvent&)>& emit);
  void forget_process(uint32_t pid);
  // This process was followed from before its first CUDA call (caught at its CUDA library's
  // load): memory no tracked allocation contains is pageable, as with complete_history.
  void mark_complete_history(uint32_t pid) { processes_[pid].complete_history = true; }
  // Every probe of a driver library this process maps was in place from `ts_ns` on (the end of
  // attaching them; the earliest, if several). Before it, and until it is known, a runtime call
  // without a driver call inside it may have made one that was not probed yet, and shows nothing.
  void note_driver_probed(uint32_t pid, uint64_t ts_ns);

  // Runtime functions (cuda::may_be_recorded_by_driver) found to record nothing that the
  // driver call they make does not: every call of theirs seen (at least kRedundantAfter, failed
  // ones included) enclosed exactly one call of the same kind, a probed driver call
  // (cudaMemsetAsync -> cuMemsetD8Async). Their probes only add traps, so the tracer may remove
  // them; the driver's probe records those calls from then on. Each function is returned once. A
  // runtime call seen without such a driver call inside it (a refusal before the driver, a
  // runtime without one), with more than one call of its kind inside it (a copy staged as two
  // copies, made directly or through runtime functions: cudaMemcpyArrayToArray), or a copy whose
  // driver copy alone says another direction (a cuMemcpy from a symbol whose lookup was not
  // seen: its pointers do not tell it is device memory), keeps its
  // function's probes for good, once the driver's probes were all in place when it began
  // (note_driver_probed): attaching a multi-probe link to a running process takes long enough for
  // calls to run with some of a library's functions probed and others not.
  static constexpr uint64_t kRedundantAfter = 32;
  std::vector<uint16_t> take_redundant_runtime_functions();

  // A function's name as the process's launch hooks told it (record/launch_rings.h): what names
  // its launches where no registration or lookup was seen (one made before gpuscope attached).
  void learn_function_name(uint32_t pid, uint64_t function, std::string name);

  // Kernel name for a launch, from registrations and lookups seen so far; "" if unknown.
  std::string kernel_name(const CallEvent& launch) const;
  // Where in the process the launch's kernel name is, when it was learnt from a registration
  // whose name was not read (a CallEvent with name_addr and no name: see lazy names in
  // record::PipelineConfig); 0 if none.
  uint64_t kernel_name_addr(const CallEvent& launch) const;

 private:
  // A kernel's name, or where it is in the process (a registration's string literal, read only
  // if the kernel is launched: PyTorch registers tens of thousands and launches a few hundred).
  struct KernelName {
    std::string name;
    uint64_t addr = 0;
  };
  const KernelName* find_kernel_name(const CallEvent& launch) const;

  struct ThreadState {
    uint32_t pid = 0;  // of its latest call (a tid is reused only after its thread is gone)
    // A runtime launch is held until the thread's next call: if that is the driver launch
    // it made, the two are tied (and each can name the other's kernel).
    std::optional<CallEvent> held_runtime_launch;
    // Calls that may be inside a runtime call not returned yet, in the order they returned:
    // driver calls with a return, and runtime calls made inside a runtime call.
    std::deque<CallEvent> held_calls;
    // NCCL groups open on the thread, and the outermost's ncclGroupStart.
    int nccl_group_depth = 0;
    int64_t nccl_group = 0;
  };
  struct ProcessState {
    bool complete_history = false;
    static constexpr uint64_t kNotYet = UINT64_MAX;
    uint64_t driver_probed_ns = kNotYet;  // note_driver_probed
    AllocationMap allocations;
    std::unordered_map<uint64_t, KernelName> stub_names;     // host stub -> device function
    std::unordered_map<uint64_t, KernelName> handle_names;   // CUfunction / CUkernel -> name
    // cuKernelGetFunction's answers for kernels not named when it was seen (the in-process hooks'
    // record of it may come before the probed lookup that names the kernel): function -> kernel.
    std::unordered_map<uint64_t, uint64_t> kernel_of_function;
    // CUDA arrays and mipmapped arrays -> bytes per element (0: a format without whole-byte
    // elements), from their creation: copies in elements (cudaMemcpy3D) need it.
    std::unordered_map<uint64_t, uint32_t> array_elem_size;
    std::unordered_map<uint64_t, uint32_t> mipmap_elem_size;
  };

  void resolve_copy(ProcessState& p, CallEvent& e) const;
  void set_host_mem(const ProcessState& p, CallEvent& e) const;
  // A runtime copy `e` and the copies made directly inside it: what one knows of the memory on
  // each side and the other could only guess (CallEvent::guessed_sides).
  void learn_sides(const ProcessState& p, CallEvent& e, const CallEvent& inner) const;
  void settle_sides(const ProcessState& p, ThreadState& t, const CallEvent& outer, CallEvent& d) const;
  // A runtime call `e` that returned: the held calls it encloses become its children (those
  // without a parent yet) and what they say about it is used (see take_redundant_runtime_functions).
  void nest_inner_calls(const ProcessState& p, ThreadState& t, const cuda::FunctionSpec& f, CallEvent& e);
  void hold(ThreadState& t, CallEvent e, const std::function<void(CallEvent&)>& emit);
  // An NCCL call's group (NcclArgs::group), from the thread's ncclGroupStart/End.
  void group_nccl_call(ThreadState& t, const cuda::FunctionSpec& f, CallEvent& e);
  void settle_runtime_launch(ThreadState& t, CallEvent* driver_launch, const std::function<void(CallEvent&)>& emit);
  void update_state(ProcessState& p, const CallEvent& e);
  HostMem host_kind(const ProcessState& p, uint64_t addr) const;

  struct RuntimeEvidence {
    uint64_t through_driver = 0;  // calls that enclosed one driver call of their kind, up to kRedundantAfter
    bool alone = false;           // a call that did not: never redundant
  };
  void weigh_runtime_call(const ProcessState& p, const cuda::FunctionSpec& f, const CallEvent& e, bool through_driver);

  bool complete_history_;
  std::unordered_map<uint16_t, RuntimeEvidence> runtime_evidence_;
  std::vector<uint16_t> redundant_runtime_;
  int64_t next_call_id_ = 1;
  std::unordered_map<uint32_t, ProcessState> processes_;
  std::unordered_map<uint32_t, ThreadState> threads_;
};

}  // namespace gpuscope::decode
