#include "decode/verbs_tracker.h"

#include "verbs_events.h"

namespace gpuscope::decode {

namespace {
constexpr uint8_t kSendSignaled = 2;  // IBV_SEND_SIGNALED
constexpr uint8_t kWcRecv = 128;      // IBV_WC_RECV: a receive's completion opcode has this bit
}  // namespace

void VerbsTracker::process(RdmaEvent& e) {
  switch (e.op) {
    case GS_VERBS_CREATE_QP:
      if (e.obj && e.a[2]) sig_all_.insert({e.pid, static_cast<uint32_t>(e.a[0])});
      break;
    case GS_VERBS_DESTROY_QP:
      if (e.ret == 0) sig_all_.erase({e.pid, static_cast<uint32_t>(e.a[0])});
      break;
    case GS_VERBS_POST_SEND:
    case GS_VERBS_POST_RECV: {
      const bool recv = e.op == GS_VERBS_POST_RECV;
      const auto qp = static_cast<uint32_t>(e.a[0]);
      const bool all = recv || sig_all_.contains({e.pid, qp});
      for (auto& w : e.wrs) {
        w.signaled = all || (w.send_flags & kSendSignaled);
        if (!w.signaled) continue;
        // A wr_id posted again before its completion came: the newer post is the one to match.
        if (posted_.size() >= kMaxOutstanding && !posted_.contains({e.pid, qp, recv, w.wr_id})) {
          ++dropped_;
          continue;
        }
        posted_[{e.pid, qp, recv, w.wr_id}] = Posted{e.ts_ns, w.opcode};
      }
      break;
    }
    case GS_VERBS_POLL_CQ: {
      const uint64_t at = e.ts_ns + e.duration_ns;  // the poll's return: when the caller learnt of it
      for (auto& c : e.wcs) {
        // A failed completion's opcode is not valid: its work request is either queue's.
        auto it = posted_.end();
        if (c.status != 0 || !(c.opcode & kWcRecv)) it = posted_.find({e.pid, c.qp_num, false, c.wr_id});
        if (it == posted_.end() && (c.status != 0 || (c.opcode & kWcRecv)))
          it = posted_.find({e.pid, c.qp_num, true, c.wr_id});
        if (it == posted_.end()) continue;
        c.latency_ns = at > it->second.ts_ns ? at - it->second.ts_ns : 0;
        if (!std::get<2>(it->first)) c.wr_opcode = it->second.opcode;
        posted_.erase(it);
      }
      break;
    }
    default:
      break;
  }
}

void VerbsTracker::forget(uint32_t pid) {
  posted_.erase(posted_.lower_bound({pid, 0, false, 0}), posted_.lower_bound({pid + 1, 0, false, 0}));
  sig_all_.erase(sig_all_.lower_bound({pid, 0}), sig_all_.lower_bound({pid + 1, 0}));
}

}  // namespace gpuscope::decode
