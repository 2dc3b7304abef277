// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. Following targets: forks, exits and execs. */

/* ---- following targets ---- */

SEC("tracepoint/sched/sched_process_fork")
int on_fork(struct trace_event_raw_sched_process_fork *ctx)
{
	__u32 parent = bpf_get_current_pid_tgid() >> 32;
	__u32 child = BPF_CORE_READ(ctx, child_pid);
	if (python_stacks) {
		/* A forked interpreter has its parent's memory layout: same _PyRuntime. */
		struct gs_py_process *py = bpf_map_lookup_elem(&python_procs, &parent);
		if (py) {
			bpf_map_update_elem(&python_procs, &child, py, BPF_ANY);
			/* User space names the child's frames with its parent's interpreter. */
			struct gs_proc_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
			if (r) {
				r->kind = GS_REC_FORK;
				r->pad = 0;
				r->pid = child;
				r->ppid = parent;
				r->exit_code = 0;
				r->ts_ns = bpf_ktime_get_ns();
				bpf_get_current_comm(r->comm, sizeof(r->comm));
				bpf_ringbuf_submit(r, 0);
			} else {
				count_lost(GS_LOST_RINGBUF_FULL);
			}
		}
	}
	if (!filter_targets || !bpf_map_lookup_elem(&targets, &parent))
		return 0;
	__u8 one = 1;
	if (bpf_map_update_elem(&targets, &child, &one, BPF_ANY))
		count_lost(GS_LOST_TARGETS_FULL);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int on_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (python_stacks && tid == tgid)
		bpf_map_delete_elem(&python_procs, &tgid);
	if ((call_unwind_tables || sample_unwind_tables) && tid == tgid)
		bpf_map_delete_elem(&unwind_procs, &tgid);
	if (!is_target(tgid))
		return 0;
	/* The process's last thread (signal->live was counted down before this tracepoint): no stop
	 * can follow, and its pid is not given to another process before this. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(task, signal, live.counter) == 0) {
		bpf_map_delete_elem(&stops_made, &tgid);
		bpf_map_delete_elem(&stops_answered, &tgid);
	}
	if (tid != tgid) {
		if (filter_targets)
			bpf_map_delete_elem(&targets, &tid);
		return 0;
	}
	/* Before its pid can be reused (user space removes it from `targets` when it reads the exit).
	 * Should user space give the slot to another target in between, that one is found in the
	 * hash: a slot is only ever emptied wrongly, never filled. */
	if (target_slots[tgid & (GS_TARGET_SLOTS - 1)] == tgid)
		target_slots[tgid & (GS_TARGET_SLOTS - 1)] = 0;
	struct gs_proc_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	r->kind = GS_REC_EXIT;
	r->pid = tgid;
	r->ppid = 0;
	r->exit_code = BPF_CORE_READ(task, exit_code);
	r->ts_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	bpf_ringbuf_submit(r, 0);
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int on_exec(void *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	/* A new program: user space says whether it is an interpreter again. */
	if (python_stacks)
		bpf_map_delete_elem(&python_procs, &tgid);
	/* Its mappings are gone: until user space gives it tables again, frame pointers. */
	if (call_unwind_tables || sample_unwind_tables)
		bpf_map_delete_elem(&unwind_procs, &tgid);
	if (!is_target(tgid))
		return 0;
	struct gs_proc_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	r->kind = GS_REC_EXEC;
	r->pid = tgid;
	r->ppid = 0;
	r->exit_code = 0;
	r->ts_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	/* User space looks at the new program at once (see the recorder's record handler). */
	bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	return 0;
}
