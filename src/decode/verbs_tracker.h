// Matches RDMA completions to the work requests they complete, by process, QP, queue and wr_id,
// for each completion's latency from its post; knows which sends complete (signalled, or every
// send of a QP made with sq_sig_all). Bounded: work requests waiting for a completion past
// kMaxOutstanding are not kept (counted in dropped()).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "common/rdma.h"

namespace gpuscope::decode {

class VerbsTracker {
 public:
  static constexpr size_t kMaxOutstanding = 1 << 16;
  // Fills in what the event's neighbours tell: a post's signalled work requests, a completion's
  // latency and work request opcode.
  void process(RdmaEvent& e);
  void forget(uint32_t pid);
  uint64_t dropped() const { return dropped_; }
  size_t outstanding() const { return posted_.size(); }

 private:
  // (pid, qp_num, receive queue, wr_id)
  using Key = std::tuple<uint32_t, uint32_t, bool, uint64_t>;
  struct Posted {
    uint64_t ts_ns;
    uint8_t opcode;
  };
  std::map<Key, Posted> posted_;
  std::set<std::pair<uint32_t, uint32_t>> sig_all_;  // (pid, qp_num) made with sq_sig_all
  uint64_t dropped_ = 0;
};

}  // namespace gpuscope::decode
