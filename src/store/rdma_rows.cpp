#include "store/rdma_rows.h"

#include "decode/verbs.h"
#include "verbs_events.h"

namespace gpuscope::store {

void RdmaRows::prepare(Db& db) {
  call_ = db.prepare(
      "INSERT INTO rdma_calls(ts_ns, duration_ns, pid, tid, func, ok, ret, object, context, qp_num, qp_type, "
      "sq_sig_all, send_cq, recv_cq, state, prev_state, dest_qp_num, attr_mask, addr, length, iova, access, lkey, rkey, "
      "dmabuf_fd, cqe, name) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,"
      "?24,?25,?26,?27)");
  wr_ = db.prepare(
      "INSERT INTO rdma_work_requests(post_id, ts_ns, pid, tid, qp_num, queue, wr_id, opcode, num_sge, bytes, signaled, "
      "remote_addr, rkey) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)");
  wc_ = db.prepare(
      "INSERT INTO rdma_completions(ts_ns, pid, tid, cq, qp_num, wr_id, status, status_code, opcode, byte_len, "
      "wr_opcode, latency_ns) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)");
}

void RdmaRows::close() {
  call_ = Stmt();
  wr_ = Stmt();
  wc_ = Stmt();
}

void RdmaRows::insert(const RdmaEvent& e) {
  if (e.op == GS_VERBS_POST_SEND || e.op == GS_VERBS_POST_RECV) {
    const bool send = e.op == GS_VERBS_POST_SEND;
    const int64_t post = next_post_++;
    for (const auto& w : e.wrs) {
      wr_.bind(1, post).bind(2, e.ts_ns).bind(3, e.pid).bind(4, e.tid).bind(5, e.a[0] & 0xffffffff);
      wr_.bind(6, send ? "send" : "recv").bind(7, w.wr_id);
      if (send) {
        const auto name = decode::wr_opcode_name(w.opcode);
        wr_.bind(8, name.empty() ? std::to_string(w.opcode) : std::string(name));
      } else {
        wr_.bind(8, "recv");
      }
      wr_.bind(9, int64_t(w.num_sge)).bind(10, w.bytes).bind(11, int64_t(w.signaled));
      if (w.rkey || w.remote_addr) wr_.bind(12, w.remote_addr).bind(13, w.rkey);
      wr_.run();
    }
    return;
  }
  if (e.op == GS_VERBS_POLL_CQ) {
    for (const auto& c : e.wcs) {
      wc_.bind(1, e.ts_ns + e.duration_ns).bind(2, e.pid).bind(3, e.tid).bind(4, e.obj).bind(5, c.qp_num);
      wc_.bind(6, c.wr_id).bind(7, decode::wc_status_name(c.status)).bind(8, int64_t(c.status));
      // A failed completion's opcode is not valid (verbs.h): none.
      if (c.status == 0) {
        const auto name = decode::wc_opcode_name(c.opcode);
        wc_.bind(9, name.empty() ? std::to_string(c.opcode) : std::string(name));
      }
      wc_.bind(10, c.byte_len);
      if (c.wr_opcode) wc_.bind(11, decode::wr_opcode_name(*c.wr_opcode));
      if (c.latency_ns) wc_.bind(12, *c.latency_ns);
      wc_.run();
    }
    // A poll that failed (a negative return) is a call of its own.
    if (e.ret >= 0) return;
  }
  insert_call(e);
}

void RdmaRows::insert_call(const RdmaEvent& e) {
  auto& q = call_;
  q.bind(1, e.ts_ns).bind(2, e.duration_ns).bind(3, e.pid).bind(4, e.tid);
  std::string func(decode::verbs_function_name(e.op));
  if (e.op == GS_VERBS_DIRECT) {
    // Named by the list it was probed from (attach/verbs_probes.cpp), appended only.
    static constexpr const char* kDirect[] = {"mlx5dv_init_obj", "mlx5dv_create_qp", "mlx5dv_devx_obj_create",
                                              "mlx5dv_devx_umem_reg"};
    func = e.a[0] < std::size(kDirect) ? kDirect[e.a[0]] : "mlx5dv_?";
  }
  q.bind(5, func);
  // Functions that return an object fail with NULL; the others return 0 or an errno.
  const bool returns_object = e.op == GS_VERBS_OPEN_DEVICE || e.op == GS_VERBS_REG_MR ||
                              e.op == GS_VERBS_REG_DMABUF_MR || e.op == GS_VERBS_CREATE_CQ ||
                              e.op == GS_VERBS_CREATE_QP;
  q.bind(6, int64_t(returns_object ? e.ret != 0 : e.ret == 0));
  if (!returns_object) q.bind(7, e.ret);
  q.bind(8, e.obj);
  const auto& a = e.a;
  switch (e.op) {
    case GS_VERBS_OPEN_DEVICE:
      q.bind(9, a[5]).bind(27, e.name);
      break;
    case GS_VERBS_REG_MR:
    case GS_VERBS_REG_DMABUF_MR:
      q.bind(19, a[0]).bind(20, a[1]).bind(21, a[2]).bind(22, a[3]);
      if (e.ret) q.bind(23, a[4] & 0xffffffff).bind(24, a[4] >> 32);
      if (e.op == GS_VERBS_REG_DMABUF_MR) q.bind(25, int64_t(int32_t(a[5])));
      break;
    case GS_VERBS_DEREG_MR:
      q.bind(19, a[0]).bind(20, a[1]).bind(23, a[4] & 0xffffffff).bind(24, a[4] >> 32);
      break;
    case GS_VERBS_CREATE_QP:
      if (e.ret) q.bind(9, a[5]).bind(10, a[0] & 0xffffffff);
      q.bind(11, decode::qp_type_name(static_cast<uint32_t>(a[1]))).bind(12, int64_t(a[2] != 0));
      q.bind(13, a[3]).bind(14, a[4]);
      break;
    case GS_VERBS_MODIFY_QP: {
      constexpr uint64_t kState = 1, kDestQpn = 1 << 20;  // IBV_QP_STATE, IBV_QP_DEST_QPN
      q.bind(10, a[0] & 0xffffffff).bind(18, a[3]).bind(16, decode::qp_state_name(static_cast<uint32_t>(a[4])));
      if (a[3] & kState) q.bind(15, decode::qp_state_name(static_cast<uint32_t>(a[1])));
      if (a[3] & kDestQpn) q.bind(17, a[2] & 0xffffffff);
      break;
    }
    case GS_VERBS_DESTROY_QP:
      q.bind(10, a[0] & 0xffffffff);
      break;
    case GS_VERBS_CREATE_CQ:
      q.bind(9, a[5]).bind(26, int64_t(int32_t(a[0])));
      break;
    case GS_VERBS_POLL_CQ:
      q.bind(26, int64_t(int32_t(a[0])));
      break;
    default:
      break;
  }
  q.run();
}

}  // namespace gpuscope::store
