// What `diagnose` concludes from a record: per process, its steps, where the thread that feeds
// the GPU spent each step (host telemetry and its CUDA calls), and findings ranked by the share of
// step time they explain, each with its evidence and the fix in the user's terms.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "diagnose/steps.h"
#include "store/record_reader.h"

namespace gpuscope::diagnose {

// Where the feeding thread's time went in some steps (nanoseconds, summed over them).
struct Breakdown {
  double steps = 0;  // how many
  double window_ns = 0;
  double on_cpu = 0, runnable = 0, io = 0, lock = 0, fd = 0, sleep = 0, other = 0;
  double unseen = 0;        // no host telemetry covers it
  // Blocked until another of its threads that makes CUDA calls woke it: its GPU work carried on
  // there (PyTorch's autograd engine runs the backward pass while the main thread waits). Not in
  // lock or fd.
  double handoff = 0;
  double runnable_idle = 0; // waiting for a CPU that had gone idle: a CPU quota's throttling
  double reclaim = 0;       // in direct reclaim (within the states above)
  double in_sync = 0, in_pageable_copy = 0, in_copy = 0, in_cuda = 0;  // in CUDA calls (in_cuda: all)
  double syncs = 0, pageable_copies = 0;
  double pageable_bytes = 0;
  double gpu_busy = 0;
  bool gpu_known = false;   // GPU times (record --gpu-times) cover these steps
  std::map<uint32_t, double> waited_for;  // pid -> runnable time spent behind it
  std::map<uint32_t, double> woken_by;    // pid -> blocked time (I/O, lock, fd) it ended, handoffs aside
  void add(const Breakdown& o);
};

struct Finding {
  std::string cause;       // cpu_contention, cpu_throttling, memory_pressure, io_wait, input_wait,
                           // lock_wait, sleep, pageable_copies, none
  std::string title;
  double share = 0;        // of step time
  double ms_per_step = 0;
  uint64_t from_ns = 0, to_ns = 0;  // the window it was seen in (from the recording's start)
  std::string evidence;
  std::string fix;
  std::string confidence;  // high, medium, low
};

struct ProcessDiagnosis {
  uint32_t pid = 0, feeding_tid = 0;
  std::string comm, cmdline;
  Steps steps;
  std::vector<double> step_ms;
  double p50_ms = 0, p90_ms = 0;
  size_t slow_steps = 0;   // longer than 1.25x the median
  Breakdown all, slow;
  std::vector<Finding> findings;  // ranked; a single `none` when nothing explains 5% of a step
};

// What the analysis works from, read from a record (diagnose) or kept live by the agent.
struct ThreadWindow {  // a store::ThreadTimeRow of the thread
  uint64_t start_ns = 0, end_ns = 0;
  double on_cpu = 0, runnable = 0, io = 0, lock = 0, fd = 0, sleep = 0, other = 0, reclaim = 0;
  uint64_t waited_ns = 0;
  uint32_t waited_for_tid = 0, waited_for_pid = 0;
  uint32_t waker_tid = 0, waker_pid = 0;
  std::string state;
};
struct CudaCall {  // a top-level call
  uint64_t ts_ns = 0, duration_ns = 0;
  uint32_t tid = 0;
  std::string kind;      // the function's kind: launch, memcpy, sync...
  std::string host_mem;  // copies: pageable, pinned, unknown
  int64_t bytes = 0;
  uint64_t key = 0;      // what was called (function, kernel, copy direction): the steps' pattern
};
struct ProcessEvidence {
  uint32_t pid = 0;
  std::string comm, cmdline;
  std::vector<CudaCall> calls;                            // in time order
  std::map<uint32_t, std::vector<ThreadWindow>> windows;  // by tid, in time order
  std::vector<std::pair<uint64_t, uint64_t>> kernels;     // GPU times, in time order
  uint64_t until_ns = 0;  // its exit, or the end of what was seen
};
// Names of processes (comm) and their parents, for the evidence.
struct ProcessNames {
  std::map<uint32_t, std::string> comm;
  std::map<uint32_t, uint32_t> ppid;
  std::string of(uint32_t pid) const;
};

// One process's diagnosis; `origin_ns`: instants are given from it. Its step count is 0 when the
// evidence holds no CUDA call.
ProcessDiagnosis analyze(const ProcessEvidence& e, const ProcessNames& names, bool host_telemetry,
                         uint64_t origin_ns);

struct Diagnosis {
  bool host_telemetry = false;
  bool gpu_times = false;
  uint64_t origin_ns = 0;
  std::vector<ProcessDiagnosis> processes;  // those that launched kernels or copied, busiest first
  std::vector<std::string> notes;           // what the record could not tell (no host telemetry...)
};

Diagnosis diagnose(store::RecordReader& rec);

}  // namespace gpuscope::diagnose
