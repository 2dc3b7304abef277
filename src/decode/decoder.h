// Turns a raw ring-buffer call record into a CallEvent: one decoder per wire signature.
#pragma once

#include <span>

#include "common/model.h"
#include "events.h"

namespace gpuscope::decode {

// Returns false for a record whose function id is unknown (a newer BPF object). A long record
// (gs_call_record_long) passes the entry data past rec.deref as `deref_more`.
bool decode_call(const gs_call_record& rec, CallEvent& out, std::span<const uint8_t> deref_more = {});

}  // namespace gpuscope::decode
