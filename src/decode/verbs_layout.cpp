// The offsets bpf/verbs.bpf.c reads the target's verbs structures at, checked against
// rdma-core's verbs.h (libibverbs-dev): the build fails where they drift.
#include <cstddef>

#include <infiniband/verbs.h>

#include "verbs_events.h"

#define GS_CHECK(type, field, value) static_assert(offsetof(type, field) == (value), #type "." #field " moved")
GS_CHECK(ibv_qp, context, GS_IBV_QP_CONTEXT);
GS_CHECK(ibv_qp, qp_num, GS_IBV_QP_NUM);
GS_CHECK(ibv_qp, state, GS_IBV_QP_STATE);
GS_CHECK(ibv_qp, qp_type, GS_IBV_QP_TYPE);
GS_CHECK(ibv_qp_attr, qp_state, GS_IBV_QP_ATTR_STATE);
GS_CHECK(ibv_qp_attr, dest_qp_num, GS_IBV_QP_ATTR_DEST_QP_NUM);
GS_CHECK(ibv_qp_init_attr, send_cq, GS_IBV_QP_INIT_SEND_CQ);
GS_CHECK(ibv_qp_init_attr, recv_cq, GS_IBV_QP_INIT_RECV_CQ);
GS_CHECK(ibv_qp_init_attr, qp_type, GS_IBV_QP_INIT_TYPE);
GS_CHECK(ibv_qp_init_attr, sq_sig_all, GS_IBV_QP_INIT_SQ_SIG_ALL);
GS_CHECK(ibv_mr, addr, GS_IBV_MR_ADDR);
GS_CHECK(ibv_mr, length, GS_IBV_MR_LENGTH);
GS_CHECK(ibv_mr, lkey, GS_IBV_MR_LKEY);
GS_CHECK(ibv_mr, rkey, GS_IBV_MR_LKEY + 4);
GS_CHECK(ibv_cq, context, GS_IBV_CQ_CONTEXT);
GS_CHECK(ibv_device, name, GS_IBV_DEVICE_NAME);
GS_CHECK(ibv_send_wr, wr_id, 0);
GS_CHECK(ibv_send_wr, next, 8);
GS_CHECK(ibv_send_wr, sg_list, 16);
GS_CHECK(ibv_send_wr, num_sge, 24);
GS_CHECK(ibv_send_wr, opcode, 28);
GS_CHECK(ibv_send_wr, send_flags, 32);
GS_CHECK(ibv_send_wr, wr.rdma.remote_addr, 40);
GS_CHECK(ibv_send_wr, wr.rdma.rkey, 48);
GS_CHECK(ibv_send_wr, wr.atomic.remote_addr, 40);
GS_CHECK(ibv_send_wr, wr.atomic.rkey, GS_IBV_SEND_WR_ATOMIC_RKEY);
static_assert(GS_IBV_SEND_WR_HEAD == GS_IBV_SEND_WR_ATOMIC_RKEY + 8);
GS_CHECK(ibv_recv_wr, next, 8);
GS_CHECK(ibv_recv_wr, sg_list, 16);
GS_CHECK(ibv_recv_wr, num_sge, 24);
static_assert(sizeof(ibv_sge) == GS_IBV_SGE_SIZE);
GS_CHECK(ibv_sge, length, GS_IBV_SGE_LENGTH);
static_assert(sizeof(ibv_wc) == GS_IBV_WC_SIZE);
GS_CHECK(ibv_wc, status, 8);
GS_CHECK(ibv_wc, opcode, 12);
GS_CHECK(ibv_wc, byte_len, 20);
GS_CHECK(ibv_wc, qp_num, 28);
GS_CHECK(ibv_context, ops.poll_cq, GS_IBV_CONTEXT_POLL_CQ);
GS_CHECK(ibv_context, ops.post_send, GS_IBV_CONTEXT_POST_SEND);
GS_CHECK(ibv_context, ops.post_recv, GS_IBV_CONTEXT_POST_RECV);
static_assert(IBV_SEND_SIGNALED == 2 && IBV_WC_RECV == 128 && IBV_WR_ATOMIC_FETCH_AND_ADD == 6);
