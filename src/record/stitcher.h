// Stores the stacks of work handed to other threads (decode/handoffs.h) below the stack of the
// call that handed it over: a kernel launched by PyTorch's autograd thread gets, outside its
// own frames (which end at the thread's start), a frame naming the handoff and then the stack
// of the loss.backward() that asked for it, down to the Python module and main.
//
// Which call a worker's stack belongs to is not in the stack: it is the latest handoff in the
// process made by a thread that is not itself a worker. Handoffs from workers (a backward pass
// run inside a backward pass) are of the same root, so the root's stack stays the one shown.
// Two Python threads in one process calling backward at once cannot be told apart: each
// worker stack goes under the latest of the two.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

#include "store/sink.h"

namespace gpuscope::record {

class Stitcher {
 public:
  using Frames = std::vector<store::StoredFrame>;
  // intern: frames -> the sink's stack id (0: refused). separator: the frame shown between a
  // worker's stack and its caller's, for handoff `id`. cut: the frame that marks a walk cut short.
  Stitcher(std::function<int64_t(const Frames&)> intern, std::function<store::StoredFrame(uint16_t)> separator,
           std::function<store::StoredFrame()> cut)
      : intern_(std::move(intern)), separator_(std::move(separator)), cut_(std::move(cut)) {}

  // A stack just stored that ran on handoff `handoff`'s worker thread. `cut`: the walk did not
  // reach the worker's own functions (the thread was known by its name; frame-pointer walks stop
  // in code built without them), so frames are missing before the separator, and marked so.
  // Returns false when too many are held: they were all forgotten, and stack ids cached elsewhere
  // must be forgotten too, so that their stacks come through note_worker_stack again.
  bool note_worker_stack(int64_t stack_id, const Frames& frames, uint16_t handoff, bool cut = false);
  // Thread `tid` entered handoff `handoff` with this stack. `on_worker`: the stack itself ran on
  // a worker thread of it (a nested call), which changes nothing.
  void on_handoff(uint32_t pid, uint32_t tid, uint16_t handoff, const Frames& frames, bool on_worker);
  // The stack to store for a call or sample of thread `tid` whose own stack is `stack_id`.
  int64_t stitch(uint32_t pid, uint32_t tid, int64_t stack_id);

  void forget_process(uint32_t pid) { roots_.erase(pid); }
  // The sink forgot its stacks: every id held is void.
  void forget_stacks();

  uint64_t stitched() const { return stitched_; }
  // Worker stacks that came before any handoff in their process (attached mid-pass), unstitched.
  uint64_t orphans() const { return orphans_; }

  static constexpr size_t kMaxWorkerStacks = 16384;
  static constexpr size_t kMaxStitched = 65536;

 private:
  struct WorkerStack {
    Frames frames;
    uint16_t handoff;
    bool cut;
  };
  struct Root {
    uint32_t tid = 0;
    uint16_t handoff = 0;
    int64_t stack_id = 0;  // the caller's stack as stored, 0: refused by the sink
    Frames frames;
  };
  std::function<int64_t(const Frames&)> intern_;
  std::function<store::StoredFrame(uint16_t)> separator_;
  std::function<store::StoredFrame()> cut_;
  std::unordered_map<int64_t, WorkerStack> workers_;
  std::unordered_map<uint32_t, Root> roots_;                  // per process: the latest root handoff
  std::map<std::pair<int64_t, int64_t>, int64_t> stitched_ids_;  // (worker stack, caller stack) -> stored
  uint64_t stitched_ = 0, orphans_ = 0;
};

}  // namespace gpuscope::record
