#include "record/stack_generations.h"

namespace gpuscope::record {

void StackGenerations::seen(int32_t id) {
  if (recycle_at_ > 0) seen_[generation_of(id)].insert(id);
}

// When to flip: the distinct ids seen in the current generation estimate its map's occupancy
// with no system call. Stacks whose records were lost on the way are not counted, so the map
// may be fuller than that; the threshold is far from full anyway, as a new stack is also lost
// when its bucket holds another one (-EEXIST), with a chance equal to the map's occupancy.
StackGenerations::Step StackGenerations::next(uint64_t taken_ns) const {
  if (recycle_at_ <= 0) return Step::None;
  if (!flipped_ns_)
    return double(seen_[current_].size()) >= recycle_at_ * map_entries_ ? Step::Flip : Step::None;
  return taken_ns >= flipped_ns_ + kGraceNs ? Step::Empty : Step::None;
}

void StackGenerations::flipped(int current, uint64_t now_ns) {
  current_ = current;
  flipped_ns_ = now_ns;
}

void StackGenerations::emptied(uint64_t now_ns) {
  const int old = current_ ^ 1;
  seen_[old].clear();
  emptied_ns_[old] = now_ns;
  flipped_ns_ = 0;
}

}  // namespace gpuscope::record
