/* Wire format of RDMA verbs records (GS_REC_VERBS), between bpf/verbs.bpf.c and src/decode/verbs.
 * One record a probed call: a control-path function exported by libibverbs (or libmlx5's direct
 * verbs), or a provider's data-path function (post_send, post_recv, poll_cq), which verbs.h's
 * inline ibv_post_send, ibv_post_recv and ibv_poll_cq call through the context's ops table. */
#ifndef GPUSCOPE_BPF_VERBS_EVENTS_H
#define GPUSCOPE_BPF_VERBS_EVENTS_H

#include "events.h"

/* The probe's cookie is the operation. Ids are stored in record files: append, never renumber. */
enum gs_verbs_op {
	GS_VERBS_OPEN_DEVICE = 1,   /* ibv_open_device(device) -> context; name: the device's */
	GS_VERBS_CLOSE_DEVICE = 2,  /* ibv_close_device(context) */
	GS_VERBS_REG_MR = 3,        /* ibv_reg_mr_iova2(pd, addr, length, iova, access) -> mr (ibv_reg_mr and
	                             * ibv_reg_mr_iova jump to it) */
	GS_VERBS_REG_DMABUF_MR = 4, /* ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access) -> mr */
	GS_VERBS_DEREG_MR = 5,      /* ibv_dereg_mr(mr) */
	GS_VERBS_CREATE_CQ = 6,     /* ibv_create_cq(context, cqe, channel, cq_context, vector) -> cq */
	GS_VERBS_DESTROY_CQ = 7,    /* ibv_destroy_cq(cq) */
	GS_VERBS_CREATE_QP = 8,     /* ibv_create_qp(pd, init_attr) -> qp */
	GS_VERBS_MODIFY_QP = 9,     /* ibv_modify_qp(qp, attr, mask) */
	GS_VERBS_DESTROY_QP = 10,   /* ibv_destroy_qp(qp) */
	GS_VERBS_POST_SEND = 11,    /* provider's post_send(qp, wr, bad_wr): entry only */
	GS_VERBS_POST_RECV = 12,    /* provider's post_recv(qp, wr, bad_wr): entry only */
	GS_VERBS_POLL_CQ = 13,      /* provider's poll_cq(cq, n, wc) -> completions (sent when != 0) */
	GS_VERBS_DIRECT = 14,       /* an mlx5dv_* function (direct verbs) that hands the caller a QP's or
	                             * CQ's own buffers or makes a QP past ibv: name holds its name */
};

#define GS_VERBS_MAX_ITEMS 16   /* work requests or completions carried by one record */
#define GS_VERBS_MAX_SGE 8      /* scatter/gather entries summed per work request */
#define GS_VERBS_COUNT_LIMIT 256 /* work requests counted (not carried) past GS_VERBS_MAX_ITEMS */
#define GS_VERBS_NAME_LEN 32

/* Layouts read from the target (x86-64, rdma-core's verbs.h; checked against the header in
 * src/decode/verbs_layout.cpp). */
#define GS_IBV_QP_CONTEXT 0
#define GS_IBV_QP_NUM 52
#define GS_IBV_QP_STATE 56
#define GS_IBV_QP_TYPE 60
#define GS_IBV_QP_ATTR_STATE 0
#define GS_IBV_QP_ATTR_DEST_QP_NUM 28
#define GS_IBV_QP_INIT_SEND_CQ 8
#define GS_IBV_QP_INIT_RECV_CQ 16
#define GS_IBV_QP_INIT_TYPE 52
#define GS_IBV_QP_INIT_SQ_SIG_ALL 56
#define GS_IBV_MR_ADDR 16
#define GS_IBV_MR_LENGTH 24
#define GS_IBV_MR_LKEY 36
#define GS_IBV_MR_RKEY 40
#define GS_IBV_CQ_CONTEXT 0
#define GS_IBV_DEVICE_NAME 24
#define GS_IBV_SEND_WR_HEAD 72 /* wr_id, next, sg_list, num_sge, opcode, send_flags, imm, rdma/atomic */
#define GS_IBV_SEND_WR_ATOMIC_RKEY 64
#define GS_IBV_RECV_WR_HEAD 32 /* wr_id, next, sg_list, num_sge */
#define GS_IBV_SGE_SIZE 16
#define GS_IBV_SGE_LENGTH 8
#define GS_IBV_WC_SIZE 48
#define GS_IBV_CONTEXT_POLL_CQ 96
#define GS_IBV_CONTEXT_POST_SEND 208
#define GS_IBV_CONTEXT_POST_RECV 216

enum gs_verbs_flags {
	GS_VERBS_TRUNCATED = 1 << 0,  /* more items than carried (counted in lost verbs_items) */
	GS_VERBS_SGE_CUT = 1 << 1,    /* a work request's bytes summed over its first GS_VERBS_MAX_SGE entries */
	GS_VERBS_READ_FAILED = 1 << 2, /* some of the target's memory could not be read */
};

/* A work request (post_send, post_recv) or a completion (poll_cq). */
struct gs_verbs_item {
	__u64 wr_id;
	__u64 remote_addr;  /* RDMA and atomic operations */
	__u32 bytes;        /* a work request: the sum of its sg_list lengths; a completion: byte_len */
	__u32 qp_num;       /* a completion's QP */
	__u32 rkey;         /* RDMA and atomic operations */
	__u8 opcode;        /* ibv_wr_opcode or ibv_wc_opcode */
	__u8 status;        /* a completion: ibv_wc_status */
	__u8 num_sge;
	__u8 send_flags;    /* ibv_send_flags' low bits: IBV_SEND_SIGNALED is 2 */
};

/* Per op, a[]: REG_MR: addr, length, iova, access, lkey | rkey << 32; REG_DMABUF_MR: offset,
 * length, iova, access, lkey | rkey << 32, fd; DEREG_MR: addr, length, -, -, lkey | rkey << 32;
 * CREATE_QP: qp_num, qp_type, sq_sig_all, send_cq, recv_cq, context; MODIFY_QP: qp_num, new state
 * (with IBV_QP_STATE in the mask), dest_qp_num (with IBV_QP_DEST_QPN), mask, state before;
 * DESTROY_QP: qp_num; CREATE_CQ: cqe, -, -, -, -, context; OPEN_DEVICE: a[5] context;
 * POST_*: a[0] qp_num, a[1] work requests in the list (up to GS_VERBS_MAX_ITEMS +
 * GS_VERBS_COUNT_LIMIT); POLL_CQ: a[0] num_entries. obj: the call's object (QP, CQ, MR or context:
 * the one returned, or the first argument). */
struct gs_verbs_record {
	__u16 kind;       /* GS_REC_VERBS */
	__u16 op;         /* gs_verbs_op */
	__u16 count;      /* items[] filled */
	__u16 flags;      /* gs_verbs_flags */
	__u32 pid;
	__u32 tid;
	__u64 ts_ns;      /* at entry (CLOCK_MONOTONIC) */
	__u64 duration_ns; /* entry to return; 0 for entry-only probes */
	__s64 ret;        /* the return value; 0 for entry-only probes */
	__u64 obj;
	__u64 a[6];
	char name[GS_VERBS_NAME_LEN];
	struct gs_verbs_item items[GS_VERBS_MAX_ITEMS];
};

/* A context that a control call handed over, for user space to read its ops table from and probe
 * the provider's data-path functions (map verbs_contexts: key -> 0 new, 1 resolved). */
struct gs_verbs_context_key {
	__u32 pid;
	__u32 pad;
	__u64 context;
};

GS_ASSERT_SIZE(struct gs_verbs_item, 32);
GS_ASSERT_SIZE(struct gs_verbs_record, 640);
GS_ASSERT_AT(struct gs_verbs_record, kind, 0);
GS_ASSERT_AT(struct gs_verbs_record, items, 128);
GS_ASSERT_SIZE(struct gs_verbs_context_key, 16);

#endif
