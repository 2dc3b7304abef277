/* A stand-in RDMA provider (tests/targets/rdma_standin.c) for tests/targets/rdma_calls.c: a
 * context whose ops are this library's functions, as a real provider's context's are. */
#pragma once
#include <infiniband/verbs.h>
#include <stdint.h>

/* A context that libibverbs' exported verbs (ibv_alloc_pd, ibv_create_cq, ibv_create_qp,
 * ibv_modify_qp, ibv_reg_mr, ibv_dereg_mr, ...) and verbs.h's inline data path reach this
 * library through. post_recv: where its ops.post_recv points (NULL: this library's). */
struct ibv_context *standin_open(void *post_recv);
/* The other poll_cq, for a second context whose probes are told apart. */
int standin_poll_cq_other(struct ibv_cq *cq, int n, struct ibv_wc *wc);
/* The completion of a work request, when it comes: its status and byte_len (otherwise success,
 * and the sum of its sg_list lengths). */
void standin_complete_with(uint64_t wr_id, enum ibv_wc_status status, uint32_t byte_len);
