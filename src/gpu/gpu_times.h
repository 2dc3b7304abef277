// GPU times (`record --gpu-times`): reading what the injection library (src/inject) wrote, and
// tying each kernel, copy and memset to the call gpuscope recorded that made it, hence to that
// call's stack and Python line.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "inject/gpu_trace.h"

namespace gpuscope::gpu {

struct GpuTrace {
  gs_gpu_trace_header header{};
  std::vector<gs_gpu_record> records;  // times already on CLOCK_MONOTONIC
  std::vector<std::string> names;      // per record: the kernel's mangled name, "" otherwise
  uint64_t dropped = 0;                // records CUPTI or the writer could not keep
  bool truncated = false;              // the file ended inside a record (the program was killed)
};

// Throws std::runtime_error for a file that is not a GPU trace; a file cut short reads up to the
// last whole record.
GpuTrace read_gpu_trace(const std::string& path);

// A call as gpuscope recorded it, enough to find it again.
struct RecordedCall {
  int64_t id = 0;
  uint32_t tid = 0;
  uint64_t ts_ns = 0, duration_ns = 0;
  std::string kind;  // functions.kind: launch, memcpy, memset, ...
};

// For each record of `trace` (one process), the id of the call that made it, or 0. An activity
// (kernel, copy, memset) points through its correlation id at CUPTI's record of the API call;
// that API call is the recorded call of the activity's kind that lies within its time span on
// the same thread (CUPTI's thread id, when it is the kernel's tid, else any thread), the nearest
// to its start. `calls` must be sorted by ts_ns.
std::vector<int64_t> correlate(const GpuTrace& trace, const std::vector<RecordedCall>& calls);

}  // namespace gpuscope::gpu
