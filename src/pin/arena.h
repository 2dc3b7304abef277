// The address space `gpuscope pin` serves large allocations from: one reservation made once
// (PROT_NONE, no memory behind it), cut into page-aligned ranges. A range is the library's alone
// from the first byte to the last page, so registering it with CUDA never overlaps another
// allocation's pages, and whether a pointer is the library's is one comparison (free() asks that
// of every pointer the program frees). Not thread-safe: its owner holds a lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace gpuscope::pin {

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();  // the reservation goes (a preloaded library's never does: it lives as long as the process)
  // Reserves the largest of `sizes` (bytes) the system allows; none: every take() fails.
  bool reserve(std::initializer_list<size_t> sizes);
  bool reserved() const { return base_ != 0; }
  bool contains(const void* p) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    return a - base_ < bytes_;  // unsigned: below base wraps above bytes_
  }

  // A range of unit(bytes), readable and writable, its pages untouched (zero); nullptr when the
  // reservation is spent.
  void* take(size_t bytes);
  // Gives the range's memory back to the system and keeps its addresses for later takes.
  void give(void* p, size_t bytes);
  // Moves a range's pages to a larger range without copying them (mremap); nullptr if it cannot.
  void* grow(void* p, size_t old_bytes, size_t new_bytes);

  static size_t page_round(size_t bytes);
  // What a range of `bytes` takes: whole pages, or whole 2 MiB units from 2 MiB on.
  static size_t unit(size_t bytes);
  uintptr_t begin() const { return base_; }
  uintptr_t end() const { return base_ + bytes_; }

 private:
  static constexpr size_t kHuge = size_t(2) << 20;
  uintptr_t take_addresses(size_t bytes);
  void keep_addresses(uintptr_t a, size_t bytes);
  uintptr_t base_ = 0;
  size_t bytes_ = 0;
  size_t used_ = 0;                       // bump: addresses below base_ + used_ were handed out once
  std::multimap<size_t, uintptr_t> free_;  // addresses given back, by length
};

}  // namespace gpuscope::pin
