// `gpuscope record`: discover the targets, attach, and run the pipeline until the command
// exits, the duration ends, or the user stops it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "record/tracer.h"

namespace gpuscope::record {

struct RecordOptions {
  std::vector<std::string> command;  // record -- CMD ...
  std::vector<pid_t> pids;           // --pid
  bool all = false;                  // --all
  double duration_s = 0;             // 0: until the command exits or Ctrl-C
  std::string output = "gpuscope.record";
  bool stacks = true;
  uint32_t ringbuf_mb = 64;
  uint32_t stack_map_entries = 32768;
  bool quiet = false;
  LaunchProbes launch_probes = LaunchProbes::Auto;
  bool bpf_stats = false;
  bool floor_probes = false;  // benchmarks: probes whose programs do nothing (the traps' own cost)
  int cpu_profile_hz = 0;  // 0: no CPU sampling
  bool dwarf_unwind_samples = true;  // CPU samples unwound from .eh_frame (false: frame pointers)
  bool dwarf_unwind_calls = false;   // CUDA calls' stacks too (a 16 KiB copy per call)
  bool table_unwind_calls = true;    // CUDA calls' stacks walked in BPF from .eh_frame tables
  bool table_unwind_samples = false; // CPU samples' likewise
  uint32_t unwind_table_mb = 128;    // memory for those tables
  std::string unwind_cache_dir = "/var/cache/gpuscope/unwind-tables";  // "": compile every time
  bool python_stacks = true;         // Python frames in the stacks of CPython processes
  uint32_t stack_every = 0;          // launches', copies', memsets' stacks: one in N, at random; 0: by budget
  double stack_budget = 0.005;       // with stack_every 0: their walks' share of each process's time
  double gpu_sample_hz = -1;         // NVML samples per second; 0: off; < 0: the default
  bool gpu_times = false;            // CUPTI activity records through the injection library
  // --pid/--all: where services started with the injection library write their GPU times
  // (GPUSCOPE_GPU_TRACE); the recording window of them is stored. "": none.
  std::string gpu_trace_dir;
};

// NVML's default sampling rate (see docs/performance.md: how often NVML refreshes its values).
inline constexpr double kDefaultGpuSampleHz = 10;

// Returns the exit code gpuscope should exit with: the command's, under `record -- CMD`.
int run_record(const RecordOptions& opts);

}  // namespace gpuscope::record
