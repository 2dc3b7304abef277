// Turns a raw ring-buffer call record into a CallEvent: one decoder per wire signature.
#pragma once

#include <span>

#include "common/model.h"
#include "cuda/functions.h"
#include "events.h"
#include "inject/launch_ring.h"

namespace gpuscope::decode {

// Returns false for a record whose function id is unknown (a newer BPF object). A long record
// (gs_call_record_long) passes the entry data past rec.deref as `deref_more`.
bool decode_call(const gs_call_record& rec, CallEvent& out, std::span<const uint8_t> deref_more = {});

// The driver function a launch of the in-process hooks' ring was a call of (its gs_launch_api;
// cuLaunchCooperativeKernel_ptsz is recorded as cuLaunchCooperativeKernel), or null.
const cuda::FunctionSpec* launch_api_function(uint16_t api);

// A launch the hooks recorded (inject/launch_ring.h) as the launch call it was: `out` keeps the
// process, thread and name it had.
bool decode_in_process_launch(const gs_launch_record& r, CallEvent& out);

}  // namespace gpuscope::decode
