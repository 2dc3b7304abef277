// A record's NCCL collectives and sends/receives, each with its communicator as its process made it
// and, with GPU times, the span of the kernels it ran: what the report's Communication section
// sums and the timeline draws.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/sqlite.h"

namespace gpuscope::report {

struct NcclCommunicator {
  int64_t rank = -1, nranks = -1;
  std::string id;  // the identity its ranks' records share; "" if not read
};

struct NcclCollective {
  int64_t call_id = 0, pid = 0, tid = 0, comm = 0;
  std::string function;  // ncclAllReduce, ...
  int64_t ts_ns = 0, enqueue_ns = 0, bytes = 0, ret = 0;
  // Its return was probed (records before collectives were probed at entry only): its result
  // (`ret`) and the time it took to enqueue are known.
  bool returned = false;
  std::optional<int64_t> group;  // its ncclGroupStart's call id
  // Its kernels on the GPU, from the first one's start to the last one's end (0, 0: none seen):
  // NCCL's kernels launched from its thread after its entry and before the thread's next NCCL call
  // (before its return where that was probed) or, inside a group, after the group's ncclGroupEnd
  // (NCCL launches a group's kernels there).
  int64_t gpu_start_ns = 0, gpu_end_ns = 0;
};

struct NcclCollectives {
  std::map<std::pair<int64_t, int64_t>, NcclCommunicator> comms;  // (pid, comm handle)
  std::vector<NcclCollective> calls;                               // in time order
  bool gpu_times = false;  // the record has the kernels' GPU times
  const NcclCommunicator* comm_of(const NcclCollective& c) const {
    auto it = comms.find({c.pid, c.comm});
    return it == comms.end() ? nullptr : &it->second;
  }
};

// Calls in [from_ns, to_ns] (CLOCK_MONOTONIC; to_ns 0: no end). Empty without an nccl_calls table.
NcclCollectives read_nccl_collectives(store::Db& db, int64_t from_ns = 0, int64_t to_ns = 0, int64_t pid = 0);

}  // namespace gpuscope::report
