/* A stand-in RDMA provider (no RDMA device anywhere in CI): the functions a real provider (mlx5,
 * rxe) puts in a context's ops, in a shared library of their own, so that gpuscope finds them in a
 * file through the context's ops table and probes them as it would a real provider's.
 *
 * libibverbs' exported verbs call the provider through the context's private ops (struct
 * verbs_ex_private, internal to rdma-core): their layout is copied here from rdma-core 44
 * (libibverbs/ibverbs.h and driver.h at v44.0, Debian 12's libibverbs1 44.0). Only the functions
 * this library defines are set; libibverbs reaches no other. The data path (verbs.h's inline
 * ibv_post_send, ibv_post_recv, ibv_poll_cq) goes through the public ibv_context.ops.
 *
 * Completions: every posted receive, and every send that is signalled (or on a QP made with
 * sq_sig_all), completes at the next poll_cq, in the order posted, with the status and byte_len
 * standin_complete_with chose (default: success and the sum of its sg_list lengths). */
#include "rdma_standin.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* rdma-core 44's struct verbs_context_ops: 76 function pointers, by name, in its order. */
struct standin_context_ops {
	void *advise_mr;
	void *alloc_dm;
	void *alloc_mw;
	void *alloc_null_mr;
	void *alloc_parent_domain;
	void *alloc_pd;
	void *alloc_td;
	void *async_event;
	void *attach_counters_point_flow;
	void *attach_mcast;
	void *bind_mw;
	void *close_xrcd;
	void *cq_event;
	void *create_ah;
	void *create_counters;
	void *create_cq;
	void *create_cq_ex;
	void *create_flow;
	void *create_flow_action_esp;
	void *create_qp;
	void *create_qp_ex;
	void *create_rwq_ind_table;
	void *create_srq;
	void *create_srq_ex;
	void *create_wq;
	void *dealloc_mw;
	void *dealloc_pd;
	void *dealloc_td;
	void *dereg_mr;
	void *destroy_ah;
	void *destroy_counters;
	void *destroy_cq;
	void *destroy_flow;
	void *destroy_flow_action;
	void *destroy_qp;
	void *destroy_rwq_ind_table;
	void *destroy_srq;
	void *destroy_wq;
	void *detach_mcast;
	void *free_context;
	void *free_dm;
	void *get_srq_num;
	void *import_dm;
	void *import_mr;
	void *import_pd;
	void *modify_cq;
	void *modify_flow_action_esp;
	void *modify_qp;
	void *modify_qp_rate_limit;
	void *modify_srq;
	void *modify_wq;
	void *open_qp;
	void *open_xrcd;
	void *poll_cq;
	void *post_recv;
	void *post_send;
	void *post_srq_ops;
	void *post_srq_recv;
	void *query_device_ex;
	void *query_ece;
	void *query_port;
	void *query_qp;
	void *query_qp_data_in_order;
	void *query_rt_values;
	void *query_srq;
	void *read_counters;
	void *reg_dm_mr;
	void *reg_dmabuf_mr;
	void *reg_mr;
	void *req_notify_cq;
	void *rereg_mr;
	void *resize_cq;
	void *set_ece;
	void *unimport_dm;
	void *unimport_mr;
	void *unimport_pd;
};
#define STANDIN_OPS_NUM (sizeof(struct standin_context_ops) / sizeof(void *))
/* rdma-core 44's struct verbs_ex_private. */
struct standin_private {
	unsigned long unsupported_ioctls[(STANDIN_OPS_NUM + 63) / 64];
	uint32_t driver_id;
	bool use_ioctl_write;
	struct standin_context_ops ops;
	bool imported;
};
/* rdma-core 44's struct verbs_mr: ibv_dereg_mr reads its type and access. */
struct standin_mr {
	struct ibv_mr ibv_mr;
	int mr_type;
	int access;
};

struct pending {
	struct ibv_wc wc;
	struct ibv_cq *cq;
};
#define MAX_PENDING 256
static struct pending pending[MAX_PENDING];
static int npending;
static struct {
	uint64_t wr_id;
	enum ibv_wc_status status;
	uint32_t byte_len;
} chosen[32];
static int nchosen;
static uint32_t next_qp_num = 0x101;
static uint32_t next_key = 0x1000;

void standin_complete_with(uint64_t wr_id, enum ibv_wc_status status, uint32_t byte_len)
{
	chosen[nchosen].wr_id = wr_id;
	chosen[nchosen].status = status;
	chosen[nchosen].byte_len = byte_len;
	nchosen++;
}

static void complete(struct ibv_cq *cq, struct ibv_qp *qp, uint64_t wr_id, enum ibv_wc_opcode opcode,
		     const struct ibv_sge *sg, int num_sge)
{
	if (npending == MAX_PENDING)
		return;
	struct pending *p = &pending[npending++];
	memset(p, 0, sizeof(*p));
	p->cq = cq;
	p->wc.wr_id = wr_id;
	p->wc.opcode = opcode;
	p->wc.qp_num = qp->qp_num;
	for (int i = 0; i < num_sge; i++)
		p->wc.byte_len += sg[i].length;
	for (int i = 0; i < nchosen; i++)
		if (chosen[i].wr_id == wr_id) {
			p->wc.status = chosen[i].status;
			p->wc.byte_len = chosen[i].byte_len;
		}
}

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
	default: return IBV_WC_SEND;
	}
}

/* The data path, as verbs.h's inline functions call it. */
static int standin_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	(void)bad_wr;
	bool all = (bool)(uintptr_t)qp->qp_context;  /* sq_sig_all, kept at create_qp */
	for (; wr; wr = wr->next)
		if (all || (wr->send_flags & IBV_SEND_SIGNALED))
			complete(qp->send_cq, qp, wr->wr_id, wc_opcode(wr->opcode), wr->sg_list, wr->num_sge);
	return 0;
}

static int standin_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	(void)bad_wr;
	for (; wr; wr = wr->next)
		complete(qp->recv_cq, qp, wr->wr_id, IBV_WC_RECV, wr->sg_list, wr->num_sge);
	return 0;
}

static int take(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int got = 0, kept = 0;
	for (int i = 0; i < npending; i++) {
		if (pending[i].cq == cq && got < n)
			wc[got++] = pending[i].wc;
		else
			pending[kept++] = pending[i];
	}
	npending = kept;
	return got;
}

static int standin_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return take(cq, n, wc);
}

int standin_poll_cq_other(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return take(cq, n, wc);
}

/* The control path, as libibverbs' exported functions call it. */
static struct ibv_pd *standin_alloc_pd(struct ibv_context *context)
{
	(void)context;
	return calloc(1, sizeof(struct ibv_pd));
}

static int standin_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

static struct ibv_cq *standin_create_cq(struct ibv_context *context, int cqe, struct ibv_comp_channel *channel,
					 int comp_vector)
{
	(void)context, (void)channel, (void)comp_vector;
	struct ibv_cq *cq = calloc(1, sizeof(*cq));
	cq->cqe = cqe;
	return cq;
}

static int standin_destroy_cq(struct ibv_cq *cq)
{
	free(cq);
	return 0;
}

static struct ibv_qp *standin_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp *qp = calloc(1, sizeof(*qp));
	qp->context = pd->context;
	qp->pd = pd;
	qp->send_cq = attr->send_cq;
	qp->recv_cq = attr->recv_cq;
	qp->qp_type = attr->qp_type;
	qp->qp_num = next_qp_num++;
	qp->state = IBV_QPS_RESET;
	qp->qp_context = (void *)(uintptr_t)(attr->sq_sig_all != 0);
	return qp;
}

static int standin_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	(void)qp, (void)attr, (void)mask;
	return 0;
}

static int standin_destroy_qp(struct ibv_qp *qp)
{
	free(qp);
	return 0;
}

static struct ibv_mr *standin_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	(void)pd, (void)addr, (void)length, (void)iova;
	struct standin_mr *mr = calloc(1, sizeof(*mr));
	mr->access = access;
	mr->ibv_mr.lkey = next_key++;
	mr->ibv_mr.rkey = next_key++;
	return &mr->ibv_mr;
}

static struct ibv_mr *standin_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
					    int fd, int access)
{
	(void)fd;
	return standin_reg_mr(pd, (void *)(uintptr_t)offset, length, iova, access);
}

static int standin_dereg_mr(struct standin_mr *mr)
{
	free(mr);
	return 0;
}

struct ibv_context *standin_open(void *post_recv)
{
	struct standin_private *priv = calloc(1, sizeof(*priv));
	priv->ops.alloc_pd = standin_alloc_pd;
	priv->ops.dealloc_pd = standin_dealloc_pd;
	priv->ops.create_cq = standin_create_cq;
	priv->ops.destroy_cq = standin_destroy_cq;
	priv->ops.create_qp = standin_create_qp;
	priv->ops.modify_qp = standin_modify_qp;
	priv->ops.destroy_qp = standin_destroy_qp;
	priv->ops.reg_mr = standin_reg_mr;
	priv->ops.reg_dmabuf_mr = standin_reg_dmabuf_mr;
	priv->ops.dereg_mr = standin_dereg_mr;
	priv->ops.post_send = standin_post_send;
	priv->ops.post_recv = standin_post_recv;
	priv->ops.poll_cq = standin_poll_cq;
	struct verbs_context *vctx = calloc(1, sizeof(*vctx));
	vctx->priv = (struct verbs_ex_private *)priv;
	struct ibv_context *ctx = &vctx->context;
	/* ibv_reg_mr reads the device's core_support (struct verbs_device, past struct ibv_device): 0. */
	ctx->device = calloc(1, 4096);
	ctx->ops.post_send = standin_post_send;
	ctx->ops.post_recv = post_recv ? post_recv : (void *)standin_post_recv;
	ctx->ops.poll_cq = post_recv ? standin_poll_cq_other : standin_poll_cq;
	return ctx;
}
