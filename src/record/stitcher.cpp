#include "record/stitcher.h"

namespace gpuscope::record {

bool Stitcher::note_worker_stack(int64_t stack_id, const Frames& frames, uint16_t handoff, bool cut) {
  if (!stack_id) return true;
  bool kept = true;
  if (workers_.size() >= kMaxWorkerStacks && !workers_.contains(stack_id)) {
    workers_.clear();
    stitched_ids_.clear();
    kept = false;
  }
  workers_.insert_or_assign(stack_id, WorkerStack{frames, handoff, cut});
  return kept;
}

void Stitcher::on_handoff(uint32_t pid, uint32_t tid, uint16_t handoff, const Frames& frames, bool on_worker) {
  if (on_worker || frames.empty()) return;
  Root& r = roots_[pid];
  r.tid = tid;
  r.handoff = handoff;
  if (r.frames == frames && r.stack_id) return;  // the same call site as the last pass: as stored
  r.frames = frames;
  r.stack_id = 0;  // interned when a worker's stack first needs it
}

int64_t Stitcher::stitch(uint32_t pid, uint32_t tid, int64_t stack_id) {
  if (!stack_id || workers_.empty()) return stack_id;
  auto w = workers_.find(stack_id);
  if (w == workers_.end()) return stack_id;
  auto r = roots_.find(pid);
  if (r == roots_.end() || r->second.handoff != w->second.handoff) {
    ++orphans_;
    return stack_id;
  }
  Root& root = r->second;
  // The caller's own thread runs work of the pass too (PyTorch's CPU nodes): its stack already
  // reaches its entry.
  if (root.tid == tid) return stack_id;
  if (!root.stack_id) root.stack_id = intern_(root.frames);  // the sink forgot it
  if (!root.stack_id) return stack_id;
  auto [it, added] = stitched_ids_.try_emplace({stack_id, root.stack_id}, 0);
  if (added) {
    if (stitched_ids_.size() > kMaxStitched) {
      stitched_ids_.clear();
      it = stitched_ids_.try_emplace({stack_id, root.stack_id}, 0).first;
    }
    Frames frames;
    frames.reserve(w->second.frames.size() + 2 + root.frames.size());
    frames.insert(frames.end(), w->second.frames.begin(), w->second.frames.end());
    // A walk marked cut short already ends in the marker.
    if (w->second.cut && (frames.empty() || frames.back() != cut_())) frames.push_back(cut_());
    frames.push_back(separator_(root.handoff));
    frames.insert(frames.end(), root.frames.begin(), root.frames.end());
    it->second = intern_(frames);
  }
  if (!it->second) return stack_id;
  ++stitched_;
  return it->second;
}

void Stitcher::forget_stacks() {
  workers_.clear();
  stitched_ids_.clear();
  for (auto& [pid, r] : roots_) r.stack_id = 0;
}

}  // namespace gpuscope::record
