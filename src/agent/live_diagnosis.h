// The agent's live diagnosis: per CUDA process, the last seconds of its CUDA calls and of its
// threads' time (host telemetry), analysed once a second as `gpuscope diagnose` analyses a record
// (diagnose::analyze). Exported as gauges: each process's step time and each finding's share of it.
// Memory is bounded: calls and windows older than the window are dropped, and so are processes
// past max_processes (their evidence comes back with their next calls).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "agent/metrics.h"
#include "common/model.h"
#include "diagnose/analysis.h"
#include "store/sink.h"

namespace gpuscope::agent {

class LiveDiagnosis {
 public:
  struct Limits {
    uint64_t window_ns = 3'000'000'000;  // the evidence each analysis looks at
    size_t max_calls = 20000;            // per process, within the window
    size_t max_windows = 4096;           // thread windows per process, within the window
    size_t max_processes = 256;
  };
  explicit LiveDiagnosis(Limits limits) : limits_(limits) {}

  // From the pipeline thread (the aggregator's sink calls).
  void add_call(const CallEvent& e);
  void add_thread_time(const store::ThreadTimeRow& r);
  void forget_process(uint32_t pid);

  // Analyses every process with calls in the window ending at now_ns (CLOCK_MONOTONIC); what it
  // finds is what families() exports until the next tick.
  void tick(uint64_t now_ns);
  struct Current {
    uint32_t pid = 0;
    std::string comm;
    double step_s = 0;
    size_t steps = 0;
    std::vector<diagnose::Finding> findings;  // not `none`
  };
  std::vector<Current> current() const;
  // gpuscope_step_seconds and gpuscope_finding_share, labelled with each process's labels.
  std::vector<MetricFamily> families(const std::function<Labels(uint32_t)>& labels_of) const;

 private:
  struct Process {
    std::string comm;
    std::deque<diagnose::CudaCall> calls;
    std::map<uint32_t, std::deque<diagnose::ThreadWindow>> windows;
    size_t window_count = 0;
  };
  void trim(Process& p, uint64_t before_ns);

  Limits limits_;
  mutable std::mutex mu_;
  std::map<uint32_t, Process> processes_;
  diagnose::ProcessNames names_;  // comm of processes seen in the evidence
  std::vector<Current> current_;
};

}  // namespace gpuscope::agent
