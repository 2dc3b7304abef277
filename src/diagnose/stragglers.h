// The ranks of one NCCL communicator seen together (a job whose processes one record holds): each
// collective matched across its ranks by order (NCCL requires every rank to issue a
// communicator's collectives in the same order), who reached it last and what that cost the
// others. A rank reaches a collective when it calls NCCL for it; its kernel runs once every rank
// has, so the others wait for the last to come.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diagnose/analysis.h"

namespace gpuscope::store {
class RecordReader;
}

namespace gpuscope::diagnose {

// One rank's calls of a communicator's collectives, in the order it made them.
struct RankCalls {
  uint32_t pid = 0;
  int64_t rank = -1;
  std::vector<uint64_t> ts_ns;
};

struct RankSkew {
  uint32_t pid = 0;
  int64_t rank = -1;
  size_t last = 0;           // collectives it reached last
  double mean_lag_ms = 0;    // behind the first rank to reach each collective, on average
  double waited_ms = 0;      // what it waited, summed, for the last rank of each collective
  uint64_t first_ns = 0, last_ns = 0;  // its first and last matched call
};

struct CommunicatorSkew {
  std::string comm_id;     // the identity its ranks' records share
  int64_t nranks = 0;      // as its ranks were made (0: unknown)
  size_t collectives = 0;  // matched across every rank seen
  std::vector<RankSkew> ranks;  // by rank
  // The rank that reached most collectives last, where that is at least half of them and more
  // than any other: the straggler (-1: none stands out).
  int straggler = -1;      // index into ranks
};

// The collectives of ranks.size() >= 2 ranks matched by order (as many as the rank that made the
// fewest made); nullopt-like (collectives 0) otherwise.
CommunicatorSkew rank_skew(std::string comm_id, int64_t nranks, std::vector<RankCalls> ranks);

// Every communicator of which the record holds two or more ranks' successful collectives.
std::vector<CommunicatorSkew> read_rank_skew(store::RecordReader& rec);

// A `straggler` finding for each process that waited for another rank of its communicator over
// kMinShare of its time, added to its findings (ranked again; `none` goes where one is added).
void add_straggler_findings(const std::vector<CommunicatorSkew>& comms, const ProcessNames& names, uint64_t origin_ns,
                            std::vector<ProcessDiagnosis>& processes);

}  // namespace gpuscope::diagnose
