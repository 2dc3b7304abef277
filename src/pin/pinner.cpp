#include "pin/pinner.h"

#include <algorithm>
#include <cstring>

namespace gpuscope::pin {
namespace {

// A freed buffer serves an allocation up to a quarter (and a page) smaller than itself.
bool fits(size_t have, size_t want) { return have >= want && have - want <= want / 4 + 4096; }

constexpr size_t kMaxSites = 4096;  // beyond, new sites share one

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Pinner::Pinner(Settings settings, advise::CopyModel model, Driver& driver)
    : settings_(settings), model_(std::move(model)), driver_(driver) {}

Pinner::Blocks::iterator Pinner::find(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(a);
  if (it == blocks_.begin()) return blocks_.end();
  --it;
  return a - it->first < it->second.bytes ? it : blocks_.end();
}

Pinner::Site& Pinner::site(SiteKey key) {
  if (sites_.size() >= kMaxSites && !sites_.count(key)) key = 0;
  return sites_[key];
}

double Pinner::saving_us(size_t bytes, bool to_device) const {
  const double b = double(bytes);
  return std::max(0.0, model_.copy_us(b, to_device, false) - model_.copy_us(b, to_device, true));
}

double Pinner::fresh_pin_cost_us(size_t bytes) const {
  // A table without untouched figures: the touched ones (a lower bound).
  const double b = double(bytes);
  return std::max(model_.register_untouched_us(b), model_.register_us(b)) + model_.unregister_us(b);
}

void Pinner::note_live(int64_t delta) {
  stats_.live_bytes += delta;
  stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
}

// Makes room under the cap for `bytes` more pinned, unpinning the pool's least recently used.
bool Pinner::room_for(size_t bytes) {
  while (stats_.pinned_bytes + bytes > settings_.cap_bytes) {
    auto victim = pool_.end();
    uint64_t oldest = UINT64_MAX;
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (uint64_t t = blocks_[it->second].last_use; t < oldest) oldest = t, victim = it;
    if (victim == pool_.end()) {
      ++stats_.declined_for_cap;
      return false;
    }
    const uintptr_t base = victim->second;
    pool_.erase(victim);
    drop_block_memory(base, blocks_[base]);
  }
  return true;
}

bool Pinner::pin(uintptr_t base, Block& b) {
  if (b.pinned || b.program_pinned || stats_.registration_disabled || child_ || !driver_.usable()) return false;
  if (!room_for(b.bytes)) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const Driver::Result r = driver_.register_range(reinterpret_cast<void*>(base), b.bytes);
  if (r == Driver::Result::already) {
    b.program_pinned = true;  // the program registered it itself: its to undo
    return false;
  }
  if (r == Driver::Result::failed) {
    // Three failures and the library stops trying: the program goes on with pageable memory.
    if (++stats_.register_failures >= 3) stats_.registration_disabled = true;
    return false;
  }
  stats_.register_ms += ms_since(t0);
  ++stats_.registrations;
  b.pinned = true;
  stats_.pinned_bytes += b.bytes;
  stats_.peak_pinned_bytes = std::max(stats_.peak_pinned_bytes, stats_.pinned_bytes);
  return true;
}

void Pinner::unpin(uintptr_t base, Block& b) {
  if (!b.pinned) return;
  b.pinned = false;
  stats_.pinned_bytes -= b.bytes;
  if (child_) return;  // the parent's registration: nothing to undo here
  const auto t0 = std::chrono::steady_clock::now();
  driver_.unregister_range(reinterpret_cast<void*>(base), b.bytes);
  stats_.unregister_ms += ms_since(t0);
  ++stats_.unregistrations;
}

// The block's memory goes back to the system (unpinned first) and the block is forgotten.
void Pinner::drop_block_memory(uintptr_t base, Block& b) {
  unpin(base, b);
  const size_t bytes = b.bytes;
  blocks_.erase(base);
  arena_.give(reinterpret_cast<void*>(base), bytes);
}

void Pinner::trim_cache() {
  while (cache_bytes_ > settings_.cache_bytes && !cache_.empty()) {
    auto it = std::prev(cache_.end());  // the largest first
    const uintptr_t base = it->second;
    cache_.erase(it);
    Block& b = blocks_[base];
    cache_bytes_ -= b.bytes;
    drop_block_memory(base, b);
  }
}

void* Pinner::from_list(std::multimap<size_t, uintptr_t>& list, size_t bytes) {
  auto it = list.lower_bound(bytes);
  if (it == list.end() || !fits(it->first, bytes)) return nullptr;
  const uintptr_t base = it->second;
  list.erase(it);
  return reinterpret_cast<void*>(base);
}

void* Pinner::allocate(size_t asked, bool zero, SiteKey key) {
  if (asked < settings_.min_bytes) return nullptr;
  std::unique_lock<std::mutex> hold(mu_, std::try_to_lock);
  if (!hold.owns_lock() || stats_.registration_disabled) return nullptr;
  if (!arena_.reserved() && !arena_.reserve({size_t(4) << 40, size_t(1) << 40, size_t(64) << 30})) return nullptr;
  const size_t bytes = Arena::unit(asked);
  Site& s = site(key);
  const bool want_pinned = settings_.mode == Mode::all || (settings_.mode == Mode::online && site_copies(s));
  void* p = nullptr;
  bool reused = false;
  if (want_pinned && (p = from_list(pool_, bytes))) {
    reused = true;
    ++stats_.pool_hits;
  } else if ((p = from_list(cache_, bytes))) {
    reused = true;
    cache_bytes_ -= blocks_[reinterpret_cast<uintptr_t>(p)].bytes;
  } else if (!(p = arena_.take(bytes))) {
    return nullptr;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  Block& b = blocks_[base];
  if (!reused) b.bytes = bytes;
  b.listed = false;
  b.asked = asked;
  b.site = key;
  b.copies = 0;
  b.saving_us = 0;
  b.last_use = ++tick_;
  if (reused && zero) std::memset(p, 0, asked);
  // A site whose past buffers' savings pay for pinning a new one (its pages untouched, which costs
  // most) gets it; its buffers are then reused from the pool.
  if (want_pinned && !b.pinned && driver_.usable()) {
    const double cost = fresh_pin_cost_us(b.bytes);
    if (settings_.mode == Mode::all || s.credit_us >= cost) {
      if (pin(base, b)) {
        ++stats_.fresh_pins;
        s.credit_us -= cost;
      }
    }
  }
  ++stats_.buffers;
  note_live(int64_t(b.bytes));
  return p;
}

void Pinner::release(void* p) {
  std::lock_guard<std::mutex> hold(mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  // Not a buffer handed out, or one freed already.
  if (it == blocks_.end() || it->second.listed) return;
  Block& b = it->second;
  b.listed = true;
  note_live(-int64_t(b.bytes));
  Site& s = site(b.site);
  ++s.finished;
  if (b.copies) ++s.copied, s.credit_us += b.saving_us, s.saved_us += b.saving_us;
  b.last_use = ++tick_;
  if (b.pinned && !child_ && site_copies(s)) {
    pool_.emplace(b.bytes, it->first);
    return;
  }
  unpin(it->first, b);
  cache_.emplace(b.bytes, it->first);
  cache_bytes_ += b.bytes;
  trim_cache();
}

void* Pinner::reallocate(void* p, size_t asked) {
  std::unique_lock<std::mutex> hold(mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  if (it == blocks_.end()) return nullptr;
  Block& b = it->second;
  if (Arena::unit(asked) <= b.bytes) {
    b.asked = asked;
    return p;
  }
  // Unpinned, the pages move to a larger range without a copy; pinned, they stay where they are
  // (the registration is of their addresses) and the contents are copied.
  if (!b.pinned) {
    const size_t old = b.bytes;
    if (void* to = arena_.grow(p, old, asked)) {
      Block moved = b;
      blocks_.erase(it);
      moved.bytes = Arena::unit(asked);
      moved.asked = asked;
      blocks_[reinterpret_cast<uintptr_t>(to)] = moved;
      note_live(int64_t(moved.bytes) - int64_t(old));
      return to;
    }
  }
  const SiteKey key = b.site;
  const size_t keep = b.asked;
  hold.unlock();
  void* to = allocate(asked, false, key);
  if (!to) return nullptr;
  std::memcpy(to, p, keep);
  release(p);
  return to;
}

size_t Pinner::usable_size(const void* p) {
  std::lock_guard<std::mutex> hold(mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  return it == blocks_.end() ? 0 : it->second.bytes;
}

Pinner::Copy Pinner::on_copy(const void* host, size_t bytes, bool to_device) {
  std::lock_guard<std::mutex> hold(mu_);
  auto it = find(host);
  if (it == blocks_.end() || it->second.program_pinned) {
    ++stats_.other_copies;
    return {};
  }
  Block& b = it->second;
  ++b.copies;
  const double saving = saving_us(bytes, to_device);
  b.saving_us += saving;
  b.last_use = ++tick_;
  // Rent paid up to the price of buying: pinned once what it would have saved reaches its cost,
  // and not before a second copy (a buffer copied once is left as it is).
  if (!b.pinned && settings_.mode != Mode::off &&
      (settings_.mode == Mode::all || (b.copies >= 2 && b.saving_us >= pin_cost_us(b.bytes))))
    pin(it->first, b);
  if (b.program_pinned) {
    ++stats_.other_copies;
    return {};
  }
  if (!b.pinned) {
    ++stats_.pageable_copies;
    stats_.pageable_copy_bytes += bytes;
    return {};
  }
  ++stats_.pinned_copies;
  stats_.pinned_copy_bytes += bytes;
  stats_.modeled_saving_ms += saving / 1000;
  return {true};
}

void Pinner::unmapping(void* p, size_t bytes) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
  if (!arena_.reserved() || hi <= arena_.begin() || lo >= arena_.end()) return;
  std::lock_guard<std::mutex> hold(mu_);
  auto it = blocks_.upper_bound(lo);
  if (it != blocks_.begin()) --it;
  for (; it != blocks_.end() && it->first < hi; ++it)
    if (it->first + it->second.bytes > lo) unpin(it->first, it->second);
}

void Pinner::forked_child() {
  // Called with the lock held since the fork (lock() before it).
  child_ = true;
  for (auto& [base, b] : blocks_)
    if (b.pinned) b.pinned = false, stats_.pinned_bytes -= b.bytes;
  // The pool's buffers are plain memory here.
  for (auto& [bytes, base] : pool_) cache_.emplace(bytes, base), cache_bytes_ += bytes;
  pool_.clear();
}

std::vector<SiteRecord> Pinner::sites() {
  std::lock_guard<std::mutex> hold(mu_);
  std::vector<SiteRecord> out;
  for (const auto& [key, s] : sites_)
    if (s.finished) out.push_back({key, s.finished, s.copied, s.saved_us});
  return out;
}

void Pinner::seed(const std::vector<SiteRecord>& records) {
  std::lock_guard<std::mutex> hold(mu_);
  for (const auto& r : records) {
    Site& s = site(r.key);
    s.finished += r.finished;
    s.copied += r.copied;
    s.saved_us += r.saved_us;
    s.credit_us += r.saved_us;
  }
}

Stats Pinner::stats() {
  std::lock_guard<std::mutex> hold(mu_);
  return stats_;
}

}  // namespace gpuscope::pin
