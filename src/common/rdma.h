// An RDMA verbs call as gpuscope records it (bpf/verbs_events.h decoded): a control-path call,
// a post of work requests, or a poll that returned completions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpuscope {

struct RdmaWorkRequest {
  uint64_t wr_id = 0;
  uint64_t remote_addr = 0;  // RDMA and atomic operations
  uint32_t bytes = 0;        // the sum of its sg_list lengths (the first 8 entries)
  uint32_t rkey = 0;
  uint8_t opcode = 0;        // ibv_wr_opcode (post_send); 0 for a receive
  uint8_t send_flags = 0;
  uint8_t num_sge = 0;
  bool signaled = false;     // a send with IBV_SEND_SIGNALED or on a QP made with sq_sig_all; every receive
};

struct RdmaCompletion {
  uint64_t wr_id = 0;
  uint32_t qp_num = 0;
  uint32_t byte_len = 0;
  uint8_t status = 0;  // ibv_wc_status
  uint8_t opcode = 0;  // ibv_wc_opcode (not valid when status is not 0)
  // From its work request's post to the return of the poll that found it; none where no post of
  // that QP and wr_id was seen (posted before the probes, or through direct verbs).
  std::optional<uint64_t> latency_ns;
  std::optional<uint8_t> wr_opcode;  // the matched work request's ibv_wr_opcode (receives: none)
};

struct RdmaEvent {
  uint16_t op = 0;  // gs_verbs_op
  uint16_t flags = 0;
  uint32_t pid = 0, tid = 0;
  uint64_t ts_ns = 0, duration_ns = 0;
  int64_t ret = 0;
  uint64_t obj = 0;
  uint64_t a[6] = {};  // by op, as bpf/verbs_events.h says
  std::string name;
  uint32_t listed = 0;  // a post: work requests in its list (past those carried: counted only)
  std::vector<RdmaWorkRequest> wrs;
  std::vector<RdmaCompletion> wcs;
};

}  // namespace gpuscope
