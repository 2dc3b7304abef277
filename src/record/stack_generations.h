// The bookkeeping of stack map recycling: which of the two BPF stack maps captures go to
// (bpf/events.h: GS_STACK_GEN_BIT), when to switch, when the other may be emptied, and which
// ids can no longer be read. The pipeline thread owns it and does to the maps what it says;
// it touches no map itself, so that the rules are tested without a kernel.
#pragma once

#include <cstdint>
#include <unordered_set>

#include "events.h"

namespace gpuscope::record {

class StackGenerations {
 public:
  // Records reach the pipeline within one poll of the ring buffer (the Tracer polls every
  // 20 ms and queues each poll's batch): work taken from the queue this long after a flip
  // holds every record submitted before it.
  static constexpr uint64_t kGraceNs = 300'000'000;

  // recycle_at: the share of `map_entries` at which the current map is recycled; 0: never.
  StackGenerations(double recycle_at, uint32_t map_entries) : recycle_at_(recycle_at), map_entries_(map_entries) {}

  static int generation_of(int32_t id) { return (id & GS_STACK_GEN_BIT) ? 1 : 0; }
  int current() const { return current_; }

  // A valid id (>= 0) resolved for the first time since its map was emptied.
  void seen(int32_t id);
  // The id's map was emptied after its record's time was taken (the BPF side takes it before
  // capturing the record's stacks): the stack was captured before, and the id may name
  // another stack now. A generation's map is only emptied while captures go to the other, so
  // an id captured after the emptying is in the map as it is now.
  bool expired(int32_t id, uint64_t ts_ns) const { return ts_ns < emptied_ns_[generation_of(id)]; }

  enum class Step {
    None,
    Flip,   // switch captures to the other map, then call flipped()
    Empty,  // empty the map of current() ^ 1 and forget its ids, then call emptied()
  };
  // What to do once the work taken from the queue at `taken_ns` is processed.
  Step next(uint64_t taken_ns) const;
  void flipped(int current, uint64_t now_ns);
  void emptied(uint64_t now_ns);

 private:
  double recycle_at_;
  uint32_t map_entries_;
  int current_ = 0;
  uint64_t flipped_ns_ = 0;  // of the recycle under way; 0: none
  // Per generation: the distinct ids seen since its map was last emptied (its occupancy,
  // estimated), and when that was (CLOCK_MONOTONIC).
  std::unordered_set<int32_t> seen_[2];
  uint64_t emptied_ns_[2] = {0, 0};
};

}  // namespace gpuscope::record
