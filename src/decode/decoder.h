// Turns a raw ring-buffer call record into a CallEvent: one decoder per wire signature.
#pragma once

#include "common/model.h"
#include "events.h"

namespace gpuscope::decode {

// Returns false for a record whose function id is unknown (a newer BPF object).
bool decode_call(const gs_call_record& rec, CallEvent& out);

}  // namespace gpuscope::decode
