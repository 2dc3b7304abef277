// What `gpuscope pin` does with the large host buffers of a program it runs (libgpuscope_pin.so,
// src/pin/preload.cpp): it serves them from its own address space (pin/arena.h), counts the
// copies each takes to and from the GPU, and registers (pins) a buffer with CUDA when the copies
// pay for it, by the copy table's figures (advise/copy_model.h):
//  - a buffer copied twice or more once what pinning would have saved on its copies reaches what
//    registering and unregistering it costs (pay rent until it adds up to the price of buying);
//  - a freed pinned buffer stays pinned in a pool, and a buffer allocated from the same site
//    (stack and size) as buffers that were copied gets one from the pool (a data loader's batch,
//    copied once and freed, every step); a site whose past buffers' savings pay for pinning one
//    more gets a freshly pinned one.
// It owns what it pins: only its own ranges are registered, and a registered range is
// unregistered before its memory goes back to the system or to a site that does not copy, before
// the program unmaps or discards its pages (munmap, mremap, madvise), and never in a forked child,
// which inherits none of the parent's registrations. Pinned bytes stay under a cap; the pool's
// least recently used buffers go first. Thread-safe: one lock. An allocation that finds it held
// (a registration can take milliseconds, and the driver may allocate while it holds its own
// locks) is left to the C library rather than wait.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "advise/copy_model.h"
#include "pin/arena.h"

namespace gpuscope::pin {

// The CUDA calls the pinner makes (the preload's go to the driver; tests record them).
class Driver {
 public:
  enum class Result { ok, already, failed };
  virtual ~Driver() = default;
  // Whether CUDA may be called now: the program has called it, this is not a forked child.
  virtual bool usable() = 0;
  virtual Result register_range(void* p, size_t bytes) = 0;
  virtual void unregister_range(void* p, size_t bytes) = 0;
};

enum class Mode {
  online,  // pin what the copies pay for
  all,     // pin every large buffer (what cudaMallocHost for everything would do)
  off,     // serve large buffers, pin nothing (the allocator's own cost)
};

struct Settings {
  Mode mode = Mode::online;
  size_t min_bytes = 256 << 10;     // smaller allocations are the C library's
  size_t cap_bytes = size_t(8) << 30;  // pinned bytes at most
  size_t cache_bytes = 64 << 20;    // freed, unpinned memory kept for reuse
};

struct Stats {
  uint64_t buffers = 0;                 // large allocations served
  uint64_t live_bytes = 0, peak_live_bytes = 0;
  uint64_t pageable_copies = 0, pageable_copy_bytes = 0;  // of buffers served, while unpinned
  uint64_t pinned_copies = 0, pinned_copy_bytes = 0;      // of buffers this library pinned
  uint64_t other_copies = 0;            // host memory not served here (or the program's own pinned)
  uint64_t registrations = 0, unregistrations = 0, register_failures = 0;
  double register_ms = 0, unregister_ms = 0;  // measured
  uint64_t pool_hits = 0, fresh_pins = 0, declined_for_cap = 0;
  uint64_t pinned_bytes = 0, peak_pinned_bytes = 0;
  double modeled_saving_ms = 0;         // on pinned copies, by the copy table
  bool registration_disabled = false;
};

using SiteKey = uint64_t;

// What a run learned about an allocation site (`gpuscope pin --profile`), for later runs to start
// from (`--use`).
struct SiteRecord {
  SiteKey key = 0;
  uint64_t finished = 0, copied = 0;  // buffers freed, and of those how many were copied
  double saved_us = 0;                // what pinning saved (or would have) on those buffers' copies
};

class Pinner {
 public:
  Pinner(Settings settings, advise::CopyModel model, Driver& driver);

  const Settings& settings() const { return settings_; }
  bool owns(const void* p) const { return arena_.contains(p); }

  // A buffer of `bytes` for an allocation at `site`, zeroed if asked; nullptr when it is not
  // this library's to serve (too small, no addresses left, the lock busy, pinning given up):
  // the C library's then.
  void* allocate(size_t bytes, bool zero, SiteKey site);
  // `p` is owned: back to the pool, the cache or the system.
  void release(void* p);
  // `p` is owned; nullptr when no memory is left (then `p` is as it was).
  void* reallocate(void* p, size_t bytes);
  size_t usable_size(const void* p);

  // A copy between host memory at `host` and the GPU. pinned: the memory was pinned here, so an
  // asynchronous copy is truly asynchronous (the preload waits for it unless relaxed).
  struct Copy {
    bool pinned = false;
  };
  Copy on_copy(const void* host, size_t bytes, bool to_device);

  // munmap, mremap, mmap(MAP_FIXED) or a discarding madvise of [p, p + bytes) is about to run:
  // whatever pinned range of the arena it overlaps is unregistered first (its pages would
  // otherwise stay pinned while the program's later copies read new ones). Outside the arena,
  // nothing to do and no lock taken.
  void unmapping(void* p, size_t bytes);
  // In a child after fork(): registrations are the parent's; none is made or undone here.
  void forked_child();

  Stats stats();
  std::vector<SiteRecord> sites();
  // Sites as an earlier run left them: a site known to copy gets pinned buffers from its first
  // allocation, its past savings paying for them.
  void seed(const std::vector<SiteRecord>& records);
  // fork(): the child must not inherit the lock held.
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

 private:
  struct Site {
    uint64_t finished = 0, copied = 0;  // buffers freed, and of those how many were copied
    double saved_us = 0;                // savings of its finished buffers
    double credit_us = 0;               // those less the pins bought for it
  };
  struct Block {
    size_t bytes = 0;   // the range's (pages)
    size_t asked = 0;   // the program's size
    SiteKey site = 0;
    bool pinned = false, program_pinned = false;
    bool listed = false;  // freed, in the pool or the cache
    uint64_t copies = 0;
    double saving_us = 0;  // what pinning saved or would have saved on its copies
    uint64_t last_use = 0;
  };
  using Blocks = std::map<uintptr_t, Block>;

  Blocks::iterator find(const void* p);
  Site& site(SiteKey key);
  bool site_copies(const Site& s) const { return s.copied > 0 && s.copied * 2 >= s.finished; }
  double saving_us(size_t bytes, bool to_device) const;
  double pin_cost_us(size_t bytes) const { return model_.pin_cost_us(double(bytes)); }
  double fresh_pin_cost_us(size_t bytes) const;
  bool room_for(size_t bytes);
  bool pin(uintptr_t base, Block& b);
  void unpin(uintptr_t base, Block& b);
  void* from_list(std::multimap<size_t, uintptr_t>& list, size_t bytes);
  void drop_block_memory(uintptr_t base, Block& b);
  void trim_cache();
  void note_live(int64_t delta);

  Settings settings_;
  advise::CopyModel model_;
  Driver& driver_;
  std::mutex mu_;
  Arena arena_;
  bool child_ = false;
  uint64_t tick_ = 0;
  Blocks blocks_;
  std::unordered_map<SiteKey, Site> sites_;
  // Freed buffers kept for reuse, by length: pinned ones (the pool) and unpinned ones (the cache).
  std::multimap<size_t, uintptr_t> pool_, cache_;
  uint64_t cache_bytes_ = 0;  // the cache's, held to settings_.cache_bytes
  Stats stats_;
};

}  // namespace gpuscope::pin
