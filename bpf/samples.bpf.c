// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. CPU profile samples of target threads. */

static __always_inline void fill_sample(struct gs_sample_record *r, __u64 id, void *ctx, __u64 py_stack, __u64 ts_ns)
{
	r->py_stack = py_stack;
	r->native_stack = 0;
	r->kind = GS_REC_SAMPLE;
	r->cpu = bpf_get_smp_processor_id();
	r->pid = id >> 32;
	r->tid = (__u32)id;
	r->ts_ns = ts_ns;
	/* A sample taken in user mode has no kernel stack: EFAULT, not a loss. */
	r->kstack_id = get_stackid(ctx, 0);
	if (r->kstack_id < 0 && r->kstack_id != -EFAULT)
		count_lost(GS_LOST_STACK);
	bpf_get_current_comm(r->comm, sizeof(r->comm));
}

/* CPU profile: a perf cpu-clock event per CPU runs this at the sampling rate; only target
 * threads are recorded. Idle (pid 0) and other processes cost one lookup. */
SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (host_telemetry && host_followed(tgid))
		host_sampled();
	if (tgid == 0 || !is_target(tgid))
		return 0;
	if (sample_only_targets && !bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	/* The user-mode registers, also when the sample interrupted a system call. */
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	__u64 py_stack = python_stack(id, regs, UNWIND_SLOT_SAMPLE);
	/* The user stack first: a new one is sent ahead of the sample. */
	__u64 ts_ns = bpf_ktime_get_ns();
	__u64 native = 0;
	bool copy = sample_stack_copy;
	if (sample_unwind_tables) {
		native = unwind_user_stack(regs, id, UNWIND_SLOT_SAMPLE, false, &copy);
		if (copy)
			copy = copy_instead_of_table();
	}
	if (copy) {
		struct gs_sample_stack_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
		if (!r) {
			count_lost(GS_LOST_RINGBUF_FULL);
			return 0;
		}
		fill_sample(&r->s, id, ctx, py_stack, ts_ns);
		r->stack_len = copy_user_state(&r->regs, r->data, regs, &r->holes);
		r->pad = 0;
		bpf_ringbuf_submit(r, submit_flags());
		return 0;
	}
	if (!native)
		native = fp_user_stack(regs, id, UNWIND_SLOT_SAMPLE, false);
	struct gs_sample_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	fill_sample(r, id, ctx, py_stack, ts_ns);
	r->native_stack = native;
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}
