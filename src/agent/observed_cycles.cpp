#include "agent/observed_cycles.h"

#include <algorithm>
#include <cmath>

namespace gpuscope::agent {

void HighRateCounts::add(const HighRateCounts& raw, double factor) {
  for (const auto& [kernel, n] : raw.launches) launches[kernel] += n * factor;
  for (const auto& [key, t] : raw.copies) {
    auto& total = copies[key];
    total.count += t.count * factor;
    total.bytes += t.bytes * factor;
    total.seconds += t.seconds * factor;
  }
  calls += raw.calls * factor;
}

void ObservedCycles::found(uint64_t t, bool at_start) {
  if (found_) return;
  found_ = true;
  starting_ = at_start;
  first_ = at_ = t;
}

void ObservedCycles::switched_on(uint64_t t, HighRateCounts& totals) {
  found(t);
  if (!cycles_.empty() && !cycles_.back().end) {
    Cycle& last = cycles_.back();
    last.end = std::max(t, last.off_at);
    raise(last, last.end, totals);  // its off-period is over: the weight is final
  }
  cycles_.push_back(Cycle{.start = t});
  while (cycles_.size() > kCyclesKept) {
    // Ended, and so has the one after it (kCyclesKept > 2): neither changes any more.
    const Cycle& old = cycles_.front();
    folded_on_ns_ += on_ns(old, old.end);
    folded_error_ += bound(old, &cycles_[1], cycles_[1].end);
    cycles_.pop_front();
  }
}

void ObservedCycles::switched_off(uint64_t t, double probe_share) {
  if (cycles_.empty() || cycles_.back().off_at || cycles_.back().end) return;
  Cycle& c = cycles_.back();
  c.off_at = std::max({t, c.start, c.last_seen});
  c.probe_share = std::clamp(probe_share, 0.0, kMaxProbeShare);
}

void ObservedCycles::exited(uint64_t t, bool exact) {
  if (exact) {
    exit_ = t;
    exit_exact_ = true;
  } else if (!exit_exact_) {
    exit_ = exit_ ? std::min(exit_, t) : t;
  }
}

ObservedCycles::Slot ObservedCycles::slot(uint64_t ts) {
  if (cycles_.empty()) return {};
  // The last cycle begun by then.
  auto it = std::find_if(cycles_.rbegin(), cycles_.rend(), [&](const Cycle& c) { return c.start <= ts; });
  if (it == cycles_.rend()) {
    // Before every cycle kept: seen while the first one's probes were being attached (they
    // fire before attaching returns), so it began then; or older than the cycles kept.
    Cycle& first = cycles_.front();
    if (first.start == first_ && ts < first_) first.start = first_ = ts;
    first.last_seen = std::max(first.last_seen, ts);
    first_call_ = std::min(first_call_, ts);
    return {&first.raw, first.weight};
  }
  first_call_ = std::min(first_call_, ts);
  Cycle* c = &*it;
  if (c->off_at && ts > c->off_at) {
    // In the cycle's off-period, yet seen: the switch times are when the agent began detaching
    // and when attaching returned, and the probes fire somewhat past the one and before the
    // other. The call shows the on-period nearer to it went on until (or began by) then.
    Cycle* next = it == cycles_.rbegin() ? nullptr : &*std::prev(it);
    if (next && next->start - ts < ts - c->off_at) {
      next->start = c->end = ts;
      c = next;
    } else {
      c->off_at = ts;
    }
  }
  c->last_seen = std::max(c->last_seen, ts);
  return {&c->raw, c->weight};
}

uint64_t ObservedCycles::on_ns(const Cycle& c, uint64_t t) {
  const uint64_t on_end = std::min(c.off_at ? c.off_at : c.end ? c.end : t, t);
  return on_end > c.start ? on_end - c.start : 0;
}

uint64_t ObservedCycles::rate_ns(const Cycle& c, uint64_t t) const {
  const uint64_t on = on_ns(c, t);
  if (!starting_ || first_call_ <= c.start) return on;
  // Started up during this on-period (or not yet: then nothing is seen in it, and it stands for
  // nothing).
  const uint64_t on_end = c.start + on;
  return first_call_ < on_end ? on_end - first_call_ : 0;
}

void ObservedCycles::raise(Cycle& c, uint64_t t, HighRateCounts& totals) {
  if (!c.off_at || c.off_at == c.start) return;  // never off: each call counts once
  uint64_t off_end = c.end ? std::min(t, c.end) : t;
  if (exit_) off_end = std::min(off_end, exit_);
  c.off_ns = off_end > c.off_at ? off_end - c.off_at : 0;
  const uint64_t rate_on = rate_ns(c, c.off_at);
  if (!rate_on) return;  // nothing seen in it but at its very end: no rate to go on, each counts once
  const double on = double(rate_on);
  const double w = (on + double(c.off_ns)) / on;
  if (w > c.weight) {  // counts only rise (a boundary a late call moves can lower w a little)
    totals.add(c.raw, w - c.weight);
    c.weight = w;
  }
}

double ObservedCycles::bound(const Cycle& c, const Cycle* next, uint64_t t) const {
  const uint64_t rate_on = c.off_at ? rate_ns(c, c.off_at) : 0;
  if (!c.off_ns || !rate_on) return 0;
  const double on = double(rate_on), off = double(c.off_ns);
  const double rate = c.raw.calls / on;  // calls per ns while on
  const double credited = rate * off;
  const uint64_t next_on = next ? rate_ns(*next, t) : 0;
  double b = next_on ? off * std::abs(next->raw.calls / double(next_on) - rate) : credited;
  b += credited * c.probe_share / (1 - c.probe_share);
  return b;
}

void ObservedCycles::advance(uint64_t now, HighRateCounts& totals) {
  if (!found_) return;
  uint64_t t = now > kRecordLagNs ? now - kRecordLagNs : 0;
  if (exit_) t = exit_exact_ ? exit_ : std::min(t, exit_);
  at_ = t = std::max(t, at_);
  uint64_t on = folded_on_ns_;
  double error = folded_error_;
  for (size_t i = 0; i < cycles_.size(); ++i) {
    raise(cycles_[i], t, totals);
    on += on_ns(cycles_[i], t);
    error += bound(cycles_[i], i + 1 < cycles_.size() ? &cycles_[i + 1] : nullptr, t);
  }
  span_ns_ = t > first_ ? t - first_ : 0;
  on_ns_ = std::min(on, span_ns_);
  error_calls_ = exact() ? 0 : error;
}

double ObservedCycles::observed_ratio() const {
  return span_ns_ ? double(on_ns_) / double(span_ns_) : 1.0;
}

}  // namespace gpuscope::agent
