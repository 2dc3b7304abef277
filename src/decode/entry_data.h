// What a call record carries from entry: the bytes an argument pointed at (a launch config, a
// copy descriptor, a batch summary), in the record and, for a long record, after it.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "events.h"

namespace gpuscope::decode {

class EntryData {
 public:
  EntryData(const gs_call_record& r, std::span<const uint8_t> more) : r_(r), more_(more) {}

  bool ok() const { return r_.flags & GS_CALL_DEREF_OK; }
  // A field at `offset`; zero where the data was not read or does not reach.
  template <typename T>
  T get(size_t offset) const {
    T v{};
    if (!ok() || offset + sizeof(T) > sizeof(r_.deref) + more_.size()) return v;
    auto* out = reinterpret_cast<uint8_t*>(&v);
    for (size_t i = 0; i < sizeof(T); ++i) {
      const size_t o = offset + i;
      out[i] = o < sizeof(r_.deref) ? r_.deref[o] : more_[o - sizeof(r_.deref)];
    }
    return v;
  }
  // A struct that lies within the record's own bytes.
  template <typename T>
  T get_struct() const {
    static_assert(sizeof(T) <= sizeof(gs_call_record::deref));
    T v{};
    if (ok()) std::memcpy(&v, r_.deref, sizeof(T));
    return v;
  }

 private:
  const gs_call_record& r_;
  std::span<const uint8_t> more_;
};

}  // namespace gpuscope::decode
