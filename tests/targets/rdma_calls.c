/* RDMA verbs through the real libibverbs and a stand-in provider (tests/targets/rdma_standin.c),
 * for tests/runtime/test_rdma.py: QPs made, moved to RTS and destroyed, memory registered, work
 * requests posted and their completions polled with verbs.h's inline ibv_post_send, ibv_post_recv
 * and ibv_poll_cq, as a program with a real device would. Prints what it did as JSON.
 *
 * gpuscope probes the provider's data path once it has read a context's ops (at ibv_create_cq or
 * ibv_create_qp's return): a real program exchanges its QP numbers with its peer before posting,
 * which takes far longer; this one waits until the provider's functions are probed instead (their
 * first bytes change when a uprobe is placed), at most 10 s, and says whether they were. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "rdma_standin.h"

static int probed(const void *fn, const unsigned char *before)
{
	return memcmp(fn, before, 4) != 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Polls until `want` completions came (4 at most a poll); returns how many came. */
static int poll_all(struct ibv_cq *cq, int want, struct ibv_wc *out)
{
	int got = 0;
	for (int tries = 0; got < want && tries < 100; tries++) {
		int n = ibv_poll_cq(cq, 4, out + got);
		if (n < 0)
			break;
		got += n;
	}
	return got;
}

int main(void)
{
	/* A second context whose post_recv lies in anonymous memory: gpuscope skips it, counted. */
	void *anon = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_context *ctx = standin_open(NULL), *other = standin_open(anon);
	unsigned char send_before[4], recv_before[4], poll_before[4], other_before[4];
	memcpy(send_before, (void *)ctx->ops.post_send, 4);
	memcpy(recv_before, (void *)ctx->ops.post_recv, 4);
	memcpy(poll_before, (void *)ctx->ops.poll_cq, 4);
	memcpy(other_before, (void *)other->ops.poll_cq, 4);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_pd *other_pd = ibv_alloc_pd(other);
	struct ibv_cq *other_cq = ibv_create_cq(other, 8, NULL, NULL, 0);

	struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					.cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 4, .max_recv_sge = 4}};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);  /* 0x101 */
	init.sq_sig_all = 1;
	struct ibv_qp *all = ibv_create_qp(pd, &init); /* 0x102: every send completes */

	struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				   .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	const int masks[3] = {IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
			      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
			      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				      IBV_QP_MAX_QP_RD_ATOMIC};
	ibv_modify_qp(qp, &attr, masks[0]);
	attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = 0x2a7,
				    .rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
	ibv_modify_qp(qp, &attr, masks[1]);
	attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7};
	ibv_modify_qp(qp, &attr, masks[2]);

	static char buf[1 << 16];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *dmabuf = ibv_reg_dmabuf_mr(pd, 0x1000, 1 << 20, 0x1000, 9, IBV_ACCESS_LOCAL_WRITE);

	const double t0 = now();
	while (now() - t0 < 10 && !(probed((void *)ctx->ops.post_send, send_before) &&
				    probed((void *)ctx->ops.post_recv, recv_before) &&
				    probed((void *)ctx->ops.poll_cq, poll_before) &&
				    probed((void *)other->ops.poll_cq, other_before))) {
		struct timespec ms = {0, 1000000};
		nanosleep(&ms, NULL);
	}
	const int data_path_probed = probed((void *)ctx->ops.post_send, send_before) &&
				     probed((void *)ctx->ops.post_recv, recv_before) &&
				     probed((void *)ctx->ops.poll_cq, poll_before) &&
				     probed((void *)other->ops.poll_cq, other_before);

	struct ibv_wc wc[64];
	/* An empty poll: nothing recorded. */
	int empty = ibv_poll_cq(cq, 4, wc);

	/* Receives: two work requests, one of two scatter/gather entries. */
	struct ibv_sge r1 = {(uintptr_t)buf, 4096, mr->lkey};
	struct ibv_sge r2[2] = {{(uintptr_t)buf + 4096, 1024, mr->lkey}, {(uintptr_t)buf + 8192, 2048, mr->lkey}};
	struct ibv_recv_wr rw2 = {.wr_id = 0x12, .sg_list = r2, .num_sge = 2};
	struct ibv_recv_wr rw1 = {.wr_id = 0x11, .next = &rw2, .sg_list = &r1, .num_sge = 1};
	struct ibv_recv_wr *bad_recv;
	standin_complete_with(0x11, IBV_WC_SUCCESS, 4000);
	int post_recv = ibv_post_recv(qp, &rw1, &bad_recv);

	/* Sends: a signalled send, an unsignalled RDMA write (never completes), an RDMA read that
	 * fails at the peer. */
	struct ibv_sge s1 = {(uintptr_t)buf, 512, mr->lkey};
	struct ibv_sge s2[2] = {{(uintptr_t)buf, 1000, mr->lkey}, {(uintptr_t)buf + 1000, 24, mr->lkey}};
	struct ibv_sge s3 = {(uintptr_t)buf, 8192, mr->lkey};
	struct ibv_send_wr w3 = {.wr_id = 0x23, .sg_list = &s3, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED, .wr.rdma = {0xbeef0000, 0x78}};
	struct ibv_send_wr w2 = {.wr_id = 0x22, .next = &w3, .sg_list = s2, .num_sge = 2, .opcode = IBV_WR_RDMA_WRITE,
				 .wr.rdma = {0xdead0000, 0x77}};
	struct ibv_send_wr w1 = {.wr_id = 0x21, .next = &w2, .sg_list = &s1, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad_send;
	standin_complete_with(0x23, IBV_WC_REM_ACCESS_ERR, 0);
	int post_send = ibv_post_send(qp, &w1, &bad_send);
	/* On the sq_sig_all QP an unsignalled send completes too. */
	struct ibv_sge s4 = {(uintptr_t)buf, 64, mr->lkey};
	struct ibv_send_wr w4 = {.wr_id = 0x31, .sg_list = &s4, .num_sge = 1, .opcode = IBV_WR_SEND};
	int post_all = ibv_post_send(all, &w4, &bad_send);
	int completions = poll_all(cq, 5, wc);

	/* A list longer than a record carries (16): 20 receives of 100 bytes on the second QP. */
	struct ibv_sge rs[20];
	struct ibv_recv_wr rws[20];
	for (int i = 0; i < 20; i++) {
		rs[i] = (struct ibv_sge){(uintptr_t)buf + 100 * i, 100, mr->lkey};
		rws[i] = (struct ibv_recv_wr){.wr_id = 0x100 + i, .next = i < 19 ? &rws[i + 1] : NULL, .sg_list = &rs[i],
					      .num_sge = 1};
	}
	int post_long = ibv_post_recv(all, rws, &bad_recv);
	int long_completions = poll_all(cq, 20, wc + 8);

	/* A QP connected that posts nothing through the provider (as one driven by direct verbs). */
	init.sq_sig_all = 0;
	struct ibv_qp *idle = ibv_create_qp(pd, &init); /* 0x103 */
	attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
	ibv_modify_qp(idle, &attr, IBV_QP_STATE);

	int dereg = ibv_dereg_mr(mr) | ibv_dereg_mr(dmabuf);
	int destroyed = ibv_destroy_qp(qp) | ibv_destroy_qp(all) | ibv_destroy_qp(idle) | ibv_destroy_cq(cq) |
			ibv_destroy_cq(other_cq);
	ibv_dealloc_pd(pd);
	ibv_dealloc_pd(other_pd);
	printf("{\"data_path_probed\": %d, \"empty\": %d, \"posts\": [%d, %d, %d, %d], \"completions\": %d, "
	       "\"long_completions\": %d, \"statuses\": [%d, %d, %d, %d, %d], \"teardown\": %d, \"masks\": [%d, %d, %d]}\n",
	       data_path_probed, empty, post_recv, post_send, post_all, post_long, completions, long_completions,
	       wc[0].status, wc[1].status, wc[2].status, wc[3].status, wc[4].status, dereg | destroyed, masks[0],
	       masks[1], masks[2]);
	return 0;
}
