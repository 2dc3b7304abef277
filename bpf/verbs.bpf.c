// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. */

/* ---- RDMA verbs ----
 * The control path (libibverbs' exported functions) with an entry and a return probe each; the
 * data path on the provider's own post_send, post_recv (entry) and poll_cq (entry and return),
 * which user space finds in a context's ops table once a control call has handed it over
 * (verbs_contexts). The cookie is the gs_verbs_op. Nothing is aggregated here: one record a call,
 * and a poll that found nothing sends none. */

#include "verbs_events.h"

/* A call's arguments (and what must be read before the callee frees or changes it), from entry to
 * return, per thread: verbs calls do not nest. */
struct verbs_pending {
	__u64 op;
	__u64 ts_ns;
	__u64 arg[6];
	__u64 pre[5];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct verbs_pending);
} verbs_pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct gs_verbs_context_key);
	__type(value, __u32);
} verbs_contexts SEC(".maps");

static __always_inline __u64 read_u64(__u64 addr, __u16 *flags)
{
	__u64 v = 0;
	if (addr && bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
		*flags |= GS_VERBS_READ_FAILED;
	return v;
}

static __always_inline __u32 read_u32(__u64 addr, __u16 *flags)
{
	__u32 v = 0;
	if (addr && bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
		*flags |= GS_VERBS_READ_FAILED;
	return v;
}

static __always_inline void note_context(__u32 tgid, __u64 context)
{
	if (!context)
		return;
	struct gs_verbs_context_key key = {.pid = tgid, .context = context};
	__u32 fresh = 0;
	/* BPF_NOEXIST: a context seen before keeps its state (resolved or not). */
	long err = bpf_map_update_elem(&verbs_contexts, &key, &fresh, BPF_NOEXIST);
	if (err && err != -17 /* EEXIST */)
		count_lost(GS_LOST_VERBS_CONTEXTS);
}

static __always_inline struct gs_verbs_record *verbs_reserve(__u64 id, __u16 op, __u64 ts_ns)
{
	struct gs_verbs_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return NULL;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->kind = GS_REC_VERBS;
	r->op = op;
	r->pid = id >> 32;
	r->tid = (__u32)id;
	r->ts_ns = ts_ns;
	return r;
}

SEC("uprobe")
int BPF_KPROBE(verbs_entry)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	/* The cookie: the op in bits 0..15; for GS_VERBS_DIRECT, the function's index above. */
	struct verbs_pending p = {.op = bpf_get_attach_cookie(ctx), .ts_ns = bpf_ktime_get_ns()};
	p.arg[0] = PT_REGS_PARM1(ctx);
	p.arg[1] = PT_REGS_PARM2(ctx);
	p.arg[2] = PT_REGS_PARM3(ctx);
	p.arg[3] = PT_REGS_PARM4(ctx);
	p.arg[4] = PT_REGS_PARM5(ctx);
	p.arg[5] = ctx->r9;
	__u16 ignored = 0;
	/* What the call frees or changes: read now. */
	if (p.op == GS_VERBS_DEREG_MR) {
		p.pre[0] = read_u64(p.arg[0] + GS_IBV_MR_ADDR, &ignored);
		p.pre[1] = read_u64(p.arg[0] + GS_IBV_MR_LENGTH, &ignored);
		p.pre[4] = read_u64(p.arg[0] + GS_IBV_MR_LKEY, &ignored);  /* lkey, rkey: adjacent */
	} else if (p.op == GS_VERBS_MODIFY_QP) {
		p.pre[0] = read_u32(p.arg[0] + GS_IBV_QP_NUM, &ignored);
		p.pre[4] = read_u32(p.arg[0] + GS_IBV_QP_STATE, &ignored);
	} else if (p.op == GS_VERBS_DESTROY_QP) {
		p.pre[0] = read_u32(p.arg[0] + GS_IBV_QP_NUM, &ignored);
	}
	__u32 tid = (__u32)id;
	if (bpf_map_update_elem(&verbs_pending, &tid, &p, BPF_ANY))
		count_lost(GS_LOST_PENDING_FULL);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(verbs_return, long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct verbs_pending *p = bpf_map_lookup_elem(&verbs_pending, &tid);
	if (!p)
		return 0;  /* not a target, or attached mid-call */
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u16 op = cookie & 0xffff;
	if (p->op != cookie) {
		bpf_map_delete_elem(&verbs_pending, &tid);
		count_lost(GS_LOST_RETURN_ORPHAN);
		return 0;
	}
	struct gs_verbs_record *r = verbs_reserve(id, op, p->ts_ns);
	if (!r) {
		bpf_map_delete_elem(&verbs_pending, &tid);
		return 0;
	}
	r->duration_ns = bpf_ktime_get_ns() - p->ts_ns;
	r->ret = ret;
	__u64 obj = p->arg[0];
	const __u64 *a = p->arg;
	__u16 flags = 0;
	switch (op) {
	case GS_VERBS_OPEN_DEVICE:
		obj = ret;
		r->a[5] = ret;
		if (a[0] && bpf_probe_read_user_str(r->name, sizeof(r->name), (void *)(a[0] + GS_IBV_DEVICE_NAME)) < 0)
			flags |= GS_VERBS_READ_FAILED;
		note_context(id >> 32, ret);
		break;
	case GS_VERBS_REG_MR:
	case GS_VERBS_REG_DMABUF_MR:
		obj = ret;
		r->a[0] = a[1];
		r->a[1] = a[2];
		r->a[2] = a[3];
		r->a[3] = op == GS_VERBS_REG_MR ? a[4] : a[5];
		if (op == GS_VERBS_REG_DMABUF_MR)
			r->a[5] = a[4];
		if (ret)
			r->a[4] = read_u64(ret + GS_IBV_MR_LKEY, &flags);
		break;
	case GS_VERBS_DEREG_MR:
		r->a[0] = p->pre[0];
		r->a[1] = p->pre[1];
		r->a[4] = p->pre[4];
		break;
	case GS_VERBS_CREATE_QP:
		obj = ret;
		r->a[1] = read_u32(a[1] + GS_IBV_QP_INIT_TYPE, &flags);
		r->a[2] = read_u32(a[1] + GS_IBV_QP_INIT_SQ_SIG_ALL, &flags);
		r->a[3] = read_u64(a[1] + GS_IBV_QP_INIT_SEND_CQ, &flags);
		r->a[4] = read_u64(a[1] + GS_IBV_QP_INIT_RECV_CQ, &flags);
		if (ret) {
			r->a[0] = read_u32(ret + GS_IBV_QP_NUM, &flags);
			r->a[5] = read_u64(ret + GS_IBV_QP_CONTEXT, &flags);
			note_context(id >> 32, r->a[5]);
		}
		break;
	case GS_VERBS_MODIFY_QP:
		r->a[0] = p->pre[0];
		r->a[1] = read_u32(a[1] + GS_IBV_QP_ATTR_STATE, &flags);
		r->a[2] = read_u32(a[1] + GS_IBV_QP_ATTR_DEST_QP_NUM, &flags);
		r->a[3] = a[2];
		r->a[4] = p->pre[4];
		break;
	case GS_VERBS_DESTROY_QP:
		r->a[0] = p->pre[0];
		break;
	case GS_VERBS_CREATE_CQ:
		obj = ret;
		r->a[0] = a[1];
		r->a[5] = a[0];
		if (ret)
			note_context(id >> 32, a[0]);
		break;
	case GS_VERBS_POLL_CQ:
		r->a[0] = a[1];
		break;
	case GS_VERBS_DIRECT:
		r->a[0] = cookie >> 16;
		break;
	default:
		break;
	}
	r->obj = obj;
	if (op == GS_VERBS_POLL_CQ) {
		/* Completions: the first GS_VERBS_MAX_ITEMS of the ret written to wc[]. */
		if (ret == 0) {
			bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);
			bpf_map_delete_elem(&verbs_pending, &tid);
			return 0;
		}
		__u64 wc = a[2];
		__u32 n = ret > 0 ? (__u32)ret : 0;
		for (__u32 i = 0; i < GS_VERBS_MAX_ITEMS; i++) {
			if (i >= n)
				break;
			__u64 e = wc + (__u64)i * GS_IBV_WC_SIZE;
			__u32 w[8];  /* wr_id, status, opcode, vendor_err, byte_len, imm, qp_num */
			if (bpf_probe_read_user(w, sizeof(w), (void *)e) != 0) {
				flags |= GS_VERBS_READ_FAILED;
				break;
			}
			struct gs_verbs_item *it = &r->items[i];
			it->wr_id = w[0] | ((__u64)w[1] << 32);
			it->status = w[2];
			it->opcode = w[3];
			it->bytes = w[5];
			it->qp_num = w[7];
			r->count = i + 1;
		}
		if (n > GS_VERBS_MAX_ITEMS) {
			flags |= GS_VERBS_TRUNCATED;
			for (__u32 i = GS_VERBS_MAX_ITEMS; i < n && i < GS_VERBS_MAX_ITEMS + GS_VERBS_COUNT_LIMIT; i++)
				count_lost(GS_LOST_VERBS_ITEMS);
		}
	}
	r->flags = flags;
	bpf_map_delete_elem(&verbs_pending, &tid);
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}

/* Sums the lengths of a work request's first GS_VERBS_MAX_SGE scatter/gather entries. */
static __always_inline __u32 sge_bytes(__u64 sg_list, __u32 num_sge, __u16 *flags)
{
	__u32 sum = 0;
	for (__u32 j = 0; j < GS_VERBS_MAX_SGE; j++) {
		if (j >= num_sge)
			break;
		sum += read_u32(sg_list + (__u64)j * GS_IBV_SGE_SIZE + GS_IBV_SGE_LENGTH, flags);
	}
	if (num_sge > GS_VERBS_MAX_SGE)
		*flags |= GS_VERBS_SGE_CUT;
	return sum;
}

/* post_send(qp, wr, bad_wr) or post_recv(qp, wr, bad_wr), at entry: the list as posted. Its
 * return (an error and bad_wr) is not probed: that would cost a second trap on the hot path. */
SEC("uprobe")
int BPF_KPROBE(verbs_post, __u64 qp, __u64 wr)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	__u64 op = bpf_get_attach_cookie(ctx);
	struct gs_verbs_record *r = verbs_reserve(id, op, bpf_ktime_get_ns());
	if (!r)
		return 0;
	__u16 flags = 0;
	r->obj = qp;
	r->a[0] = read_u32(qp + GS_IBV_QP_NUM, &flags);
	const bool send = op == GS_VERBS_POST_SEND;
	__u32 n = 0;
	for (__u32 i = 0; i < GS_VERBS_MAX_ITEMS; i++) {
		if (!wr)
			break;
		__u64 w[GS_IBV_SEND_WR_HEAD / 8] = {};
		if (bpf_probe_read_user(w, send ? GS_IBV_SEND_WR_HEAD : GS_IBV_RECV_WR_HEAD, (void *)wr) != 0) {
			flags |= GS_VERBS_READ_FAILED;
			wr = 0;
			break;
		}
		struct gs_verbs_item *it = &r->items[i];
		it->wr_id = w[0];
		__u32 num_sge = (__u32)w[3];
		it->num_sge = num_sge > 255 ? 255 : num_sge;
		it->bytes = sge_bytes(w[2], num_sge, &flags);
		if (send) {
			__u32 opcode = (__u32)(w[3] >> 32);
			it->opcode = opcode;
			it->send_flags = (__u8)w[4];
			/* RDMA write/read (0, 1, 4): remote_addr, rkey; atomics (5, 6): rkey past
			 * compare_add and swap. */
			if (opcode <= 1 || opcode == 4 || opcode == 5 || opcode == 6) {
				it->remote_addr = w[5];
				it->rkey = (opcode == 5 || opcode == 6) ? (__u32)w[8] : (__u32)w[6];
			}
		}
		n = i + 1;
		wr = w[1];
	}
	r->count = n;
	if (wr) {
		/* Longer than a record carries: count the rest (up to a bound). */
		flags |= GS_VERBS_TRUNCATED;
		for (__u32 i = 0; i < GS_VERBS_COUNT_LIMIT; i++) {
			if (!wr)
				break;
			n++;
			count_lost(GS_LOST_VERBS_ITEMS);
			if (bpf_probe_read_user(&wr, sizeof(wr), (void *)(wr + 8)) != 0)
				break;
		}
	}
	r->a[1] = n;
	r->flags = flags;
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}
