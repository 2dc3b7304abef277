#include "decode/verbs.h"

#include <array>
#include <cstring>

#include "verbs_events.h"

namespace gpuscope::decode {

bool decode_verbs(const void* data, size_t size, RdmaEvent& e) {
  if (size < sizeof(gs_verbs_record)) return false;
  gs_verbs_record r;
  std::memcpy(&r, data, sizeof(r));
  e = RdmaEvent{};
  e.op = r.op;
  e.flags = r.flags;
  e.pid = r.pid;
  e.tid = r.tid;
  e.ts_ns = r.ts_ns;
  e.duration_ns = r.duration_ns;
  e.ret = r.ret;
  e.obj = r.obj;
  std::memcpy(e.a, r.a, sizeof(e.a));
  e.name.assign(r.name, strnlen(r.name, sizeof(r.name)));
  const size_t n = std::min<size_t>(r.count, GS_VERBS_MAX_ITEMS);
  if (r.op == GS_VERBS_POST_SEND || r.op == GS_VERBS_POST_RECV) {
    e.listed = static_cast<uint32_t>(r.a[1]);
    for (size_t i = 0; i < n; ++i) {
      const auto& it = r.items[i];
      RdmaWorkRequest w{it.wr_id, it.remote_addr, it.bytes, it.rkey, it.opcode, it.send_flags, it.num_sge};
      if (r.op == GS_VERBS_POST_RECV) w.opcode = 0;
      e.wrs.push_back(w);
    }
  } else if (r.op == GS_VERBS_POLL_CQ) {
    for (size_t i = 0; i < n; ++i) {
      const auto& it = r.items[i];
      e.wcs.push_back(RdmaCompletion{it.wr_id, it.qp_num, it.bytes, it.status, it.opcode});
    }
  }
  return true;
}

std::string_view verbs_function_name(uint16_t op) {
  switch (op) {
    case GS_VERBS_OPEN_DEVICE: return "ibv_open_device";
    case GS_VERBS_CLOSE_DEVICE: return "ibv_close_device";
    case GS_VERBS_REG_MR: return "ibv_reg_mr";
    case GS_VERBS_REG_DMABUF_MR: return "ibv_reg_dmabuf_mr";
    case GS_VERBS_DEREG_MR: return "ibv_dereg_mr";
    case GS_VERBS_CREATE_CQ: return "ibv_create_cq";
    case GS_VERBS_DESTROY_CQ: return "ibv_destroy_cq";
    case GS_VERBS_CREATE_QP: return "ibv_create_qp";
    case GS_VERBS_MODIFY_QP: return "ibv_modify_qp";
    case GS_VERBS_DESTROY_QP: return "ibv_destroy_qp";
    case GS_VERBS_POST_SEND: return "post_send";
    case GS_VERBS_POST_RECV: return "post_recv";
    case GS_VERBS_POLL_CQ: return "poll_cq";
    case GS_VERBS_DIRECT: return "mlx5dv";
  }
  return "";
}

std::string_view wr_opcode_name(uint8_t opcode) {
  static constexpr std::array<std::string_view, 11> kNames{
      "rdma_write", "rdma_write_with_imm", "send", "send_with_imm", "rdma_read", "atomic_cmp_and_swp",
      "atomic_fetch_and_add", "local_inv", "bind_mw", "send_with_inv", "tso"};
  return opcode < kNames.size() ? kNames[opcode] : "";
}

std::string_view wc_opcode_name(uint8_t opcode) {
  static constexpr std::array<std::string_view, 10> kNames{
      "send", "rdma_write", "rdma_read", "comp_swap", "fetch_add", "bind_mw", "local_inv", "tso", "", "atomic_write"};
  if (opcode < kNames.size()) return kNames[opcode];
  if (opcode == 128) return "recv";
  if (opcode == 129) return "recv_rdma_with_imm";
  return "";
}

std::string_view qp_state_name(uint32_t state) {
  static constexpr std::array<std::string_view, 7> kNames{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return state < kNames.size() ? kNames[state] : "";
}

std::string_view qp_type_name(uint32_t type) {
  switch (type) {
    case 2: return "RC";
    case 3: return "UC";
    case 4: return "UD";
    case 8: return "RAW_PACKET";
    case 9: return "XRC_SEND";
    case 10: return "XRC_RECV";
    case 0xff: return "DRIVER";
  }
  return "";
}

std::string_view wc_status_name(uint8_t status) {
  // rdma-core's libibverbs/enum_strs.c, word for word (tests/unit/test_verbs.cpp checks them
  // against the installed library's ibv_wc_status_str).
  static constexpr std::array<std::string_view, 24> kNames{
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error", "remote access error",
      "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
      "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
      "invalid EE context state", "fatal error", "response timeout error", "general error", "TM error",
      "TM software rendezvous"};
  return status < kNames.size() ? kNames[status] : "unknown";
}

}  // namespace gpuscope::decode
