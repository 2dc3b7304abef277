#include "record/stack_budget.h"

#include <algorithm>
#include <cmath>

namespace gpuscope::record {

std::optional<uint32_t> StackBudget::observe(pid_t pid, uint64_t now_ns, uint64_t walk_ns, uint64_t walks,
                                             uint64_t first_walk_ns) {
  auto [it, added] = processes_.try_emplace(pid);
  Process& p = it->second;
  if (added) p.first_ns = p.last_ns = first_walk_ns && first_walk_ns <= now_ns ? first_walk_ns : now_ns;
  if (now_ns < p.last_ns + (p.decisions ? kIntervalNs : kFirstIntervalNs) || walk_ns < p.last_walk_ns)
    return std::nullopt;
  ++p.decisions;

  // What every stack would cost, as a share of the interval: this interval's walks stood for
  // `every` calls each.
  const double share = double(walk_ns - p.last_walk_ns) / double(now_ns - p.last_ns);
  const double needed = share * p.every / budget_;  // the N that just meets the budget
  p.last_ns = now_ns;
  p.last_walk_ns = walk_ns;
  p.last_walks = walks;

  const double aim = needed * kHeadroom;
  uint32_t every = p.every;
  if (aim > p.every) {
    every = uint32_t(std::min<double>(std::ceil(aim), kMaxEvery));
  } else if (needed * kLowerBelow < p.every) {
    // Down by a quarter at most: a training step's phases make one interval cheap and the next
    // dear, and halving N after a cheap one overshot the budget in the next.
    every = std::max(uint32_t(std::max(std::ceil(aim), 1.0)), p.every - std::max(p.every / 4, 1u));
  }
  if (every == p.every) return std::nullopt;
  p.every = every;
  p.max_every = std::max(p.max_every, every);
  ++p.changes;
  return every;
}

}  // namespace gpuscope::record
