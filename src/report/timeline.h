// `gpuscope timeline`: a record as a Chrome trace-event JSON file, which Perfetto's UI
// (ui.perfetto.dev) and chrome://tracing open. A track per CPU thread with its CUDA calls (with
// their Python line) and CPU samples, and NVML's readings as counter tracks per GPU.
#pragma once

#include <cstdint>
#include <ostream>

#include "store/record_reader.h"
#include "symbolize/symbolizer.h"

namespace gpuscope::report {

struct TimelineOptions {
  double from_s = 0;  // window, in seconds from the recording's start
  double to_s = 0;    // 0: to the end
  int64_t pid = 0;    // 0: every process
};

struct TimelineStats {
  uint64_t events = 0;
  uint64_t bytes = 0;
};

// Streams the trace to `out` event by event (memory stays flat on long recordings).
TimelineStats write_timeline(store::RecordReader& rec, symbolize::Symbolizer& sym, const TimelineOptions& opt,
                             std::ostream& out);

}  // namespace gpuscope::report
