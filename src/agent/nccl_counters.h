// A process's NCCL calls as the agent exports them, shaped like the NCCL Inspector's series: per
// communicator (the identity its ranks' records share, so that a job's ranks line up), the
// process's rank in it, and the collective or send/receive. NCCL's probes are low-rate ones, never
// switched off by the budget: these are exact counts. Collectives are probed at entry only (one
// trap a call): a call NCCL refused counts as made, and the time it took is not seen.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "agent/metrics.h"
#include "common/model.h"
#include "cuda/functions.h"

namespace gpuscope::agent {

class NcclCounters {
 public:
  void add(const CallEvent& e, const cuda::FunctionSpec& f);
  // gpuscope_nccl_calls_total, _bytes_total: samples labelled `base` and the communicator's,
  // appended to the two families in that order.
  void append(const Labels& base, std::vector<MetricFamily*> families) const;
  // The families, empty, in the order append() fills them.
  static std::vector<MetricFamily> make_families();

 private:
  struct Communicator {
    std::string id;  // the ranks' shared identity (hex); "" where its making was not seen
    int64_t rank = -1, nranks = -1;
  };
  struct Totals {
    double calls = 0, bytes = 0;
  };
  // Bounded per process: communicators made, and (communicator, function) pairs counted; past
  // them, calls count under an unknown communicator.
  static constexpr size_t kMaxCommunicators = 256, kMaxKeys = 1024;
  std::map<uint64_t, Communicator> comms_;                // handle -> as made
  std::map<std::pair<uint64_t, uint16_t>, Totals> totals_;  // (handle, function id)
};

}  // namespace gpuscope::agent
