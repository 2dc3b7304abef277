// `gpuscope record`: discover the targets, attach, and run the pipeline until the command
// exits, the duration ends, or the user stops it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "record/tracer.h"

namespace gpuscope::record {

// NVML's default sampling rate (see docs/performance.md: how often NVML refreshes its values).
inline constexpr double kDefaultGpuSampleHz = 10;

// How record traces by default, where it differs from a Tracer's own defaults.
inline TracerOptions record_tracer_defaults() {
  TracerOptions t;
  t.stack_budget = 0.005;  // stacks by budget (--stack-every sets stack_every, and no budget)
  t.table_unwind_calls = true;
  t.unwind_cache_dir = "/var/cache/gpuscope/unwind-tables";  // "": compile every time
  t.stack_map_entries = 32768;
  t.gpu_sample_hz = kDefaultGpuSampleHz;
  t.host_telemetry = true;
  t.host_alloc_min_bytes = 256 << 10;
  return t;
}

struct RecordOptions {
  std::vector<std::string> command;  // record -- CMD ...
  std::vector<pid_t> pids;           // --pid
  double duration_s = 0;             // 0: until the command exits or Ctrl-C
  std::string output = "gpuscope.record";
  bool gpu_times = false;            // CUPTI activity records through the injection library
  // --pid/--all: where services started with the injection library write their GPU times
  // (GPUSCOPE_GPU_TRACE); the recording window of them is stored. "": none.
  std::string gpu_trace_dir;
  TracerOptions tracer = record_tracer_defaults();  // tracer.all: --all
};

// Returns the exit code gpuscope should exit with: the command's, under `record -- CMD`.
int run_record(const RecordOptions& opts);

}  // namespace gpuscope::record
