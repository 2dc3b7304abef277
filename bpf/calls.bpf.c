// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. The CUDA call probes: launches (entry only), calls with a return probe, their
 * records and stacks; and the calibration probe. */

#include "call_record.bpf.h"

/* A batch copy's entry data (GS_COOKIE_BATCH): (dsts, srcs, sizes, count, ...) in both APIs
 * and CUDA versions. sizes[] is read GS_DEREF_LEN bytes at a time into the second half of dst,
 * in a bpf_loop (a plain loop's paths were past the verifier's limit). */
struct batch_read {
	struct gs_batch_entry *b;
	__u64 *chunk;
	const __u64 *sizes;
	__u64 count;
};

static long batch_sizes_step(__u32 i, struct batch_read *c)
{
	struct gs_batch_entry *b = c->b;
	__u64 summed = b->summed;
	if (summed >= c->count)
		return 1;
	__u32 n = GS_DEREF_LEN / 8;
	if (c->count - summed < n)
		n = c->count - summed;
	if (bpf_probe_read_user(c->chunk, n * 8, c->sizes + summed)) {
		count_lost(GS_LOST_DEREF);
		return 1;
	}
	__u64 bytes = 0;
	for (__u32 j = 0; j < GS_DEREF_LEN / 8; j++)
		if (j < n)
			bytes += c->chunk[j];
	b->bytes += bytes;
	b->summed = summed + n;
	return 0;
}

static __noinline __u32 read_batch_sizes(const __u64 *args, __u8 *dst, __u32 *flags)
{
	struct gs_batch_entry *b = (struct gs_batch_entry *)dst;
	struct batch_read c = {.b = b, .chunk = (__u64 *)(dst + GS_DEREF_LEN), .sizes = (const __u64 *)args[2],
			       .count = args[3] < GS_BATCH_MAX_SIZES ? args[3] : GS_BATCH_MAX_SIZES};
	b->bytes = 0;
	b->summed = 0;
	bpf_loop(GS_BATCH_MAX_SIZES / (GS_DEREF_LEN / 8), batch_sizes_step, &c, 0);
	if (bpf_probe_read_user(&b->dst0, sizeof(b->dst0), (const void *)args[0]))
		b->dst0 = 0;
	if (bpf_probe_read_user(&b->src0, sizeof(b->src0), (const void *)args[1]))
		b->src0 = 0;
	*flags |= GS_CALL_DEREF_OK;
	return sizeof(*b);
}

/* A 3-D batch copy's entry data (GS_COOKIE_BATCH3D): (numOps, opList, ...). Each operation is
 * read into the second half of dst. */
struct batch3d_read {
	struct gs_batch3d_entry *b;
	__u8 *op;
	const __u8 *list;
	__u64 count;
};

static long batch3d_step(__u32 i, struct batch3d_read *c)
{
	struct gs_batch3d_entry *b = c->b;
	__u8 *op = c->op;
	if (i >= c->count)
		return 1;
	if (bpf_probe_read_user(op, GS_BATCH3D_OP_LEN, c->list + (__u64)i * GS_BATCH3D_OP_LEN)) {
		count_lost(GS_LOST_DEREF);
		return 1;
	}
	/* cudaMemcpy3DOperand / CUmemcpy3DOperand: its type, then its pointer or array at +8. */
	__u32 src_type = *(__u32 *)op, dst_type = *(__u32 *)(op + 40);
	__u64 src = *(__u64 *)(op + 8), dst = *(__u64 *)(op + 48);
	__u64 elems = *(__u64 *)(op + 80) * *(__u64 *)(op + 88) * *(__u64 *)(op + 96);
	if (i == 0) {
		b->src0_type = src_type;
		b->dst0_type = dst_type;
		b->src0 = src;
		b->dst0 = dst;
	}
	b->ops = i + 1;
	if (src_type != GS_MEMCPY_OPERAND_ARRAY && dst_type != GS_MEMCPY_OPERAND_ARRAY) {
		b->bytes += elems;
		return 0;
	}
	__u64 array = dst_type == GS_MEMCPY_OPERAND_ARRAY ? dst : src;
	if (!b->array[0] || b->array[0] == array) {
		b->array[0] = array;
		b->elems[0] += elems;
	} else if (!b->array[1] || b->array[1] == array) {
		b->array[1] = array;
		b->elems[1] += elems;
	} else {
		b->other_ops++;
	}
	return 0;
}

static __noinline __u32 read_batch3d_ops(const __u64 *args, __u8 *dst, __u32 *flags)
{
	struct gs_batch3d_entry *b = (struct gs_batch3d_entry *)dst;
	struct batch3d_read c = {.b = b, .op = dst + GS_DEREF_LEN, .list = (const __u8 *)args[1],
				 .count = args[0] < GS_BATCH_MAX_OPS ? args[0] : GS_BATCH_MAX_OPS};
	__builtin_memset(b, 0, sizeof(*b));
	bpf_loop(GS_BATCH_MAX_OPS, batch3d_step, &c, 0);
	*flags |= GS_CALL_DEREF_OK;
	return sizeof(*b);
}

/* Copy what an argument points at (a launch config, a copy descriptor, a kernel name) into dst,
 * which has room for `room` bytes (GS_DEREF_LEN in a record, GS_DEREF_LONG_LEN in a pending
 * call). Not inlined (nor the other rare paths of the call probes: send_later_lookup,
 * hold_later_lookup): code that most calls skip still filled the cache lines that the launch
 * probe runs through. */
static __noinline __u32 read_entry_deref(__u64 cookie, const __u64 *args, __u8 *dst, __u32 *flags, __u32 room)
{
	/* room is a constant at each call: the verifier drops this branch where it is too small. */
	if (room >= GS_DEREF_LONG_LEN) {
		if (GS_COOKIE_BATCH(cookie))
			return read_batch_sizes(args, dst, flags);
		if (GS_COOKIE_BATCH3D(cookie))
			return read_batch3d_ops(args, dst, flags);
	}
	__u32 arg = GS_COOKIE_ENTRY_ARG(cookie);
	if (!arg || arg > GS_NUM_ARGS)
		return 0;
	/* The mask only convinces the verifier; arg is already known to be in range. */
	const void *src = (const void *)args[(arg - 1) & 15];
	__u32 len = GS_COOKIE_ENTRY_LEN(cookie);
	if (len > room)
		len = room;
	if (len > GS_DEREF_LONG_LEN)
		len = GS_DEREF_LONG_LEN;
	long n;
	if (GS_COOKIE_ENTRY_STR(cookie))
		n = bpf_probe_read_user_str(dst, GS_DEREF_LEN, src);
	else
		n = bpf_probe_read_user(dst, len, src) == 0 ? len : -1;
	if (n < 0) {
		/* A name not paged in is read again by user space; only data is lost. */
		if (!GS_COOKIE_ENTRY_STR(cookie))
			count_lost(GS_LOST_DEREF);
		return 0;
	}
	*flags |= GS_CALL_DEREF_OK;
	return n;
}

/* The copies' rate limit, as a generic cell rate algorithm: the time at which the bucket of
 * GS_STACK_COPIES_BURST copies would be empty again at GS_STACK_COPIES_PER_S. */
volatile __u64 copies_tat;
#define COPY_INTERVAL_NS (1000000000ULL / GS_STACK_COPIES_PER_S)

/* A walk that needs a table not made yet sends a copy of the stack instead: true unless that
 * would pass GS_STACK_COPIES_PER_S or the ring holds more than half its size unread (copies are
 * 16 KiB), then frame pointers this time. A burst of new stacks at start (a process that launches
 * at once, before the walker is loaded) must not flood user space, which unwinds each copy. */
static __always_inline bool copy_instead_of_table(void)
{
	__u64 now = bpf_ktime_get_ns(), tat = copies_tat;
	bool over = tat > now + GS_STACK_COPIES_BURST * COPY_INTERVAL_NS;
	if (!over)  /* racy across CPUs: a few more may pass than the limit says */
		copies_tat = (tat > now ? tat : now) + COPY_INTERVAL_NS;
	if (over ||
	    bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > bpf_ringbuf_query(&events, BPF_RB_RING_SIZE) / 2) {
		count_lost(GS_LOST_UNWIND_COPY_LIMIT);
		return false;
	}
	struct unwind_stat_counts *st = unwind_stat_counts();
	if (st)
		st->n[GS_UNWIND_STAT_COPIES]++;
	return true;
}

/* The call's user stack: the id of a stack walked here (from the unwind tables with
 * --call-stacks eh-frame, else along frame pointers), or 0 and a copy of the stack sent now,
 * ahead of the call's record (flagged in *flags): with --call-stacks dwarf, and with eh-frame
 * while a table the walk needs is not there yet. */
static __always_inline __u64 call_user_stack(struct pt_regs *ctx, __u64 cookie, __u64 ts_ns, __u32 *flags)
{
	if (!capture_stacks || GS_COOKIE_NO_STACK(cookie))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	bool copy = call_stack_copy;
	if (call_unwind_tables) {
		__u64 native = unwind_user_stack(ctx, id, UNWIND_SLOT_CALL, true, &copy);
		if (!copy)
			return native;
		copy = copy_instead_of_table();
	} else if (call_tables_later && !walker_failed) {
		copy = copy_instead_of_table();  /* the walker is being loaded */
	}
	if (copy) {
		struct gs_stack_copy_record *c = bpf_ringbuf_reserve(&events, sizeof(*c), 0);
		if (!c) {
			count_lost(GS_LOST_RINGBUF_FULL);
			return 0;
		}
		c->kind = GS_REC_STACK_COPY;
		c->pid = id >> 32;
		c->tid = (__u32)id;
		c->ts_ns = ts_ns;
		c->stack_len = copy_user_state(&c->regs, c->data, ctx, &c->holes);
		bpf_ringbuf_submit(c, BPF_RB_NO_WAKEUP);
		*flags |= GS_CALL_STACK_COPIED;
		return 0;
	}
	return fp_user_stack(ctx, id, UNWIND_SLOT_CALL, true);
}

/* A call's stacks, both walks and the budget's charge. A global function, verified and compiled
 * apart: inlined, the walks' code sat in the middle of every call probe, which cost calls whose
 * stack is not taken (most, under --stack-every or --stack-budget) time as well. */
struct call_stacks {
	__u64 native;
	__u64 py;
	__u32 flags;
	__u32 pad;
};

__noinline int take_call_stacks(struct pt_regs *ctx, __u64 cookie, __u64 ts_ns, struct call_stacks *out)
{
	if (!out)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 flags = 0;
	out->native = call_user_stack(ctx, cookie, ts_ns, &flags);
	out->py = !capture_stacks || GS_COOKIE_NO_STACK(cookie) ? 0 : python_stack(id, ctx, UNWIND_SLOT_CALL);
	out->flags = flags;
	charge_stack_walks(cookie, id >> 32, ts_ns);
	return 0;
}


/* The record of a lookup whose out-pointer was left for later (struct thread_marks), as its
 * return probe would have sent it, less the result and duration. */
static __noinline void send_later_lookup(struct thread_marks *m, __u64 id)
{
	struct gs_call_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		m->later_ts = 0;
		return;
	}
	call_record_head(r, id, m->later_cookie, GS_CALL_OUT_LATER, m->later_ts, 0);
	r->ret = 0;
	__builtin_memset(r->args, 0, sizeof(r->args));
	r->args[0] = m->later_args[0];
	r->args[1] = m->later_args[1];
	r->deref_len = 0;
	r->stack_weight = 0;
	r->py_stack = 0;
	r->native_stack = 0;
	r->out_value = 0;
	if (bpf_probe_read_user(&r->out_value, sizeof(r->out_value), (void *)m->later_out) == 0)
		r->flags |= GS_CALL_OUT_OK;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	m->later_ts = 0;
	bpf_ringbuf_submit(r, submit_flags());
}

/* A lookup whose out-pointer is read later (GS_COOKIE_OUT_LATER): kept in the thread's marks
 * until its next launch or lookup. 1 when kept, 0 when it is to be sent now. */
static __noinline int hold_later_lookup(struct pt_regs *ctx, __u64 id, __u64 cookie, __u64 ts_ns)
{
	struct thread_marks *m = bpf_task_storage_get(&thread_marks, bpf_get_current_task_btf(), 0,
						      BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!m)
		return 0;
	if (m->later_ts)  /* a lookup with no launch after it: its handle is written by now */
		send_later_lookup(m, id);
	__u32 out_idx = GS_COOKIE_RET_ARG(cookie) - 1;
	if (out_idx >= 2)  /* lookups' out-pointers come first or second */
		return 0;
	m->later_args[0] = ctx->di;
	m->later_args[1] = ctx->si;
	/* From the copies: a choice between ctx fields compiles to a ctx pointer moved by a
	 * variable offset, which the verifier refuses. */
	m->later_out = m->later_args[out_idx & 1];
	m->later_cookie = cookie;
	m->later_ts = ts_ns;
	return 1;
}

/* Launches: entry only, so that a launch costs one trap. */
SEC("uprobe")
int call_entry_emit(struct pt_regs *ctx)
{
	if (call_tables_later)
		bpf_tail_call(ctx, &upgrade_calls, UPGRADE_EMIT);
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 ts_ns = bpf_ktime_get_ns();
	__u32 flags = 0;
	bool skip_stack = false;
	if (GS_COOKIE_RT_LAUNCH(cookie)) {
		struct thread_marks *m = bpf_task_storage_get(&thread_marks, bpf_get_current_task_btf(), 0,
							      BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (m)
			m->rt_launch_ns = ts_ns;
	} else if (GS_COOKIE_DRV_LAUNCH(cookie)) {
		struct thread_marks *m = bpf_task_storage_get(&thread_marks, bpf_get_current_task_btf(), 0, 0);
		if (m) {
			if (m->later_ts)
				send_later_lookup(m, id);
			if (m->rt_launch_ns && ts_ns - m->rt_launch_ns < RUNTIME_TO_DRIVER_NS) {
				skip_stack = true;
				flags |= GS_CALL_UNDER_RUNTIME;
				m->rt_launch_ns = 0;
			}
		}
	} else if (GS_COOKIE_OUT_LATER(cookie) && hold_later_lookup(ctx, id, cookie, ts_ns)) {
		return 0;
	}
	__u32 stack_weight = 0;
	if (!skip_stack)
		skip_stack = stack_sampled_out(cookie, id >> 32, &flags, &stack_weight);
	/* Before the call's record is reserved, so that a stack copy or a new Python stack comes
	 * ahead of it. */
	struct call_stacks st = {};
	if (!skip_stack && capture_stacks) {
		take_call_stacks(ctx, cookie, ts_ns, &st);
		flags |= st.flags;
	}

	struct gs_call_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	call_record_head(r, id, cookie, flags, ts_ns, 0);
	r->ret = 0;
	r->out_value = 0;
	read_args(ctx, r->args);
	r->deref_len = GS_COOKIE_ENTRY_ARG(cookie) ? read_entry_deref(cookie, r->args, r->deref, &r->flags, GS_DEREF_LEN) : 0;
	r->stack_weight = stack_weight;
	r->py_stack = st.py;
	r->native_stack = st.native;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}

/* Calls whose result matters: keep the entry until the return probe fires. */
SEC("uprobe")
int call_entry(struct pt_regs *ctx)
{
	if (call_tables_later)
		bpf_tail_call(ctx, &upgrade_calls, UPGRADE_ENTRY);
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tag = pending_tag(cookie);
	__u64 now = bpf_ktime_get_ns();
	struct pending_thread *t = bpf_task_storage_get(&pending, bpf_get_current_task_btf(), 0,
							 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t) {
		count_lost(GS_LOST_PENDING_FULL);
		return 0;
	}
	int slot = pending_slot(t, tag);
	if (slot >= 0) {
		/* The same function entered again before it returned: a wrapper of the driver's name
		 * calling the driver's own (XLA's and Triton's shims call libcuda's, and both are
		 * probed). The outer call is the one recorded; without this its return found no
		 * entry. An older entry is stale (its return was missed): this call takes its slot. */
		struct pending_call *outer = &t->call[slot & (PENDING_SLOTS - 1)];
		if (now - outer->ts_ns < GS_NESTED_CALL_NS) {
			outer->nested++;
			return 0;
		}
	} else if ((slot = pending_slot(t, 0)) < 0) {
		/* No free slot: the one pending longest gives way (most likely a missed return). */
		__u64 oldest_ts = ~0ULL;
		for (int i = 0; i < PENDING_SLOTS; i++)
			if (t->call[i].ts_ns < oldest_ts) {
				oldest_ts = t->call[i].ts_ns;
				slot = i;
			}
		count_lost(GS_LOST_PENDING_FULL);
	}

	slot &= PENDING_SLOTS - 1;
	struct pending_call *p = &t->call[slot];
	t->tag[slot] = tag;
	p->ts_ns = now;
	p->flags = 0;
	p->nested = 0;
	read_args(ctx, p->args);
	p->deref_len = read_entry_deref(cookie, p->args, p->deref, &p->flags, GS_DEREF_LONG_LEN);
	/* A call made inside a runtime call: a driver call (cudaMemsetAsync's cuMemsetD8Async) or
	 * another runtime function the runtime calls through its exported name
	 * (cudaMemcpyArrayToArray's cudaMemcpyFromArray and cudaMemcpyToArray). Its stack would be
	 * the runtime call's and a few of the runtime's frames; user space nests it under that call
	 * and gives it its stack. A runtime entry older than GS_NESTED_CALL_NS is one whose return
	 * was missed, as may be one of a function whose probes are being removed (retiring_funcs):
	 * neither makes this call an inner one. Launches do not come here (call_entry_emit). */
	bool in_runtime = false;
	for (int i = 0; i < PENDING_SLOTS; i++) {
		if (i == slot || !(t->tag[i] & PENDING_RUNTIME) || now - t->call[i].ts_ns >= GS_NESTED_CALL_NS)
			continue;
		__u32 fn = (t->tag[i] & ~PENDING_RUNTIME) - 1;
		if (fn < 256 && (retiring_funcs[(fn >> 6) & 3] & (1ULL << (fn & 63))))
			continue;
		in_runtime = true;
	}
	if (in_runtime)
		p->flags |= GS_CALL_UNDER_RUNTIME;
	p->stack_weight = 0;
	if (in_runtime || !capture_stacks || stack_sampled_out(cookie, id >> 32, &p->flags, &p->stack_weight)) {
		p->native_stack = 0;
		p->py_stack = 0;
		return 0;
	}
	struct call_stacks st = {};
	take_call_stacks(ctx, cookie, now, &st);
	p->native_stack = st.native;
	p->py_stack = st.py;
	p->flags |= st.flags;
	return 0;
}

SEC("uretprobe")
int call_return(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct pending_thread *t = bpf_task_storage_get(&pending, bpf_get_current_task_btf(), 0, 0);
	int slot = t ? pending_slot(t, pending_tag(cookie)) : -1;
	if (!t || slot < 0) {
		__u32 fn = GS_COOKIE_FUNC(cookie);
		if (!(retiring_funcs[(fn >> 6) & 3] & (1ULL << (fn & 63))))
			count_lost(GS_LOST_RETURN_ORPHAN);
		return 0;
	}
	slot &= PENDING_SLOTS - 1;
	struct pending_call *p = &t->call[slot];
	if (p->nested) {  /* an inner call of the same function returned */
		p->nested--;
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();

	struct gs_call_record *r;
	if (p->deref_len > GS_DEREF_LEN) {  /* a 3-D copy's descriptor: a longer record */
		struct gs_call_record_long *l = bpf_ringbuf_reserve(&events, sizeof(*l), 0);
		/* By words: both are 8-byte aligned, which a memcpy through the slot's variable
		 * offset does not know (it copied byte by byte). */
		const __u64 *from = (const __u64 *)(p->deref + GS_DEREF_LEN);
		__u64 *to = l ? (__u64 *)l->deref_more : 0;
		if (to)
			for (int i = 0; i < (GS_DEREF_LONG_LEN - GS_DEREF_LEN) / 8; i++)
				to[i] = from[i];
		r = (struct gs_call_record *)l;
	} else {
		r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	}
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		t->tag[slot] = 0;
		return 0;
	}
	call_record_head(r, id, cookie, p->flags | GS_CALL_HAS_RETURN, p->ts_ns, now - p->ts_ns);
	r->ret = ctx->ax;
	r->stack_weight = p->stack_weight;
	r->py_stack = p->py_stack;
	r->native_stack = p->native_stack;
	r->deref_len = p->deref_len;
	__builtin_memcpy(r->args, p->args, sizeof(r->args));
	__builtin_memcpy(r->deref, p->deref, sizeof(r->deref));
	r->out_value = 0;
	__u32 out_idx = GS_COOKIE_RET_ARG(cookie) - 1;
	if (out_idx < GS_NUM_REG_ARGS) {
		if (bpf_probe_read_user(&r->out_value, sizeof(r->out_value), (void *)p->args[out_idx & 7]) == 0)
			r->flags |= GS_CALL_OUT_OK;
		/* A second out-pointer after it, a size (GS_COOKIE_OUT_SIZE): as the entry data. */
		if (GS_COOKIE_OUT_SIZE(cookie) && out_idx + 1 < GS_NUM_REG_ARGS &&
		    bpf_probe_read_user(r->deref, sizeof(__u64), (void *)p->args[(out_idx + 1) & 7]) == 0) {
			r->deref_len = sizeof(__u64);
			r->flags |= GS_CALL_DEREF_OK;
		}
	}
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	t->tag[slot] = 0;
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}

/* The agent's calibration: a probe that does nothing, on a function of the agent's own, so
 * that what one hit costs on this machine (the trap, the kernel's uprobe path) is measured
 * apart from what the programs above do. */
SEC("uprobe")
int calibration_hit(struct pt_regs *ctx)
{
	return 0;
}
