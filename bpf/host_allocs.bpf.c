// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own.
 *
 * ---- host allocations: large anonymous mappings of target processes, with their stacks ----
 * `advise` names the place a pageable buffer was allocated: the C library serves allocations of
 * 128 KiB and more with mmap (at first: it raises that threshold up to 32 MiB as such blocks are
 * freed), PyTorch's and NumPy's large arrays among them. A mapping's stack is sent as a copy and
 * unwound in user space (libc and most libraries have no frame pointers); mmap calls are few, and
 * the copies have a rate limit of their own. Unmappings and moves of such ranges are sent without a
 * stack. Records: host_alloc_events.h. */

const volatile __u64 host_alloc_min_bytes = 256 << 10;

#define GS_PROT_WRITE 0x2
#define GS_MAP_SHARED 0x01
#define GS_MAP_ANONYMOUS 0x20
#define GS_MAP_STACK 0x20000  /* a thread's stack: its buffers were not allocated where it was made */

struct host_alloc_args {
	__u64 old_addr;
	__u64 length;
	__u32 op;
};

/* A mapping or move asked for, from its syscall's entry to its exit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);  /* tid */
	__type(value, struct host_alloc_args);
} host_alloc_pending SEC(".maps");

/* Stack copies of mappings: at most GS_HOST_ALLOC_COPIES_PER_S after a burst of as many (a
 * generic cell rate algorithm, as the calls' copies), none while the ring is half full; past
 * that, a mapping is sent with its Python stack alone. */
#define GS_HOST_ALLOC_COPIES_PER_S 200
#define HOST_ALLOC_COPY_INTERVAL_NS (1000000000ULL / GS_HOST_ALLOC_COPIES_PER_S)
volatile __u64 host_alloc_copies_tat;

static __always_inline bool host_alloc_copy_allowed(void)
{
	__u64 now = bpf_ktime_get_ns(), tat = host_alloc_copies_tat;
	if (tat > now + GS_HOST_ALLOC_COPIES_PER_S * HOST_ALLOC_COPY_INTERVAL_NS ||
	    bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > bpf_ringbuf_query(&events, BPF_RB_RING_SIZE) / 2) {
		count_lost(GS_LOST_HOST_ALLOC_STACK);
		return false;
	}
	host_alloc_copies_tat = (tat > now ? tat : now) + HOST_ALLOC_COPY_INTERVAL_NS;
	return true;
}

static __always_inline void send_host_alloc(__u64 id, __u32 op, __u64 addr, __u64 length, __u64 old_addr,
					    __u32 unrecorded)
{
	const bool made = (op == GS_HOST_MMAP || op == GS_HOST_MALLOC) && addr;  /* addr 0: a count alone */
	const bool stack = made && host_alloc_copy_allowed();
	const __u32 size = stack ? sizeof(struct gs_host_alloc_record)
				 : offsetof(struct gs_host_alloc_record, stack) + sizeof(struct gs_sample_record);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	/* A new Python stack is sent ahead of the record naming it. */
	__u64 py_stack = made ? python_stack(id, regs, UNWIND_SLOT_CALL) : 0;
	struct gs_host_alloc_record *r = bpf_ringbuf_reserve(&events, size, 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return;
	}
	r->kind = GS_REC_HOST_ALLOC;
	r->op = op;
	r->unrecorded = unrecorded;
	r->addr = addr;
	r->length = length;
	r->old_addr = old_addr;
	struct gs_sample_record *s = &r->stack.s;
	s->kind = GS_REC_HOST_ALLOC;
	s->cpu = bpf_get_smp_processor_id();
	s->pid = id >> 32;
	s->tid = (__u32)id;
	s->kstack_id = -1;
	s->ts_ns = bpf_ktime_get_ns();
	s->py_stack = py_stack;
	s->native_stack = 0;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	if (stack) {
		r->stack.stack_len = copy_user_state(&r->stack.regs, r->stack.data, regs, &r->stack.holes);
		r->stack.pad = 0;
	}
	bpf_ringbuf_submit(r, submit_flags());
}

SEC("tracepoint/syscalls/sys_enter_mmap")
int host_mmap_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 length = ctx->args[1], prot = ctx->args[2], flags = ctx->args[3];
	if (length < host_alloc_min_bytes || !(flags & GS_MAP_ANONYMOUS) || (flags & (GS_MAP_SHARED | GS_MAP_STACK)) ||
	    !(prot & GS_PROT_WRITE))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	__u32 tid = (__u32)id;
	struct host_alloc_args a = {.old_addr = 0, .length = length, .op = GS_HOST_MMAP};
	bpf_map_update_elem(&host_alloc_pending, &tid, &a, BPF_ANY);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_mremap")
int host_mremap_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 old_length = ctx->args[1], length = ctx->args[2];
	if (old_length < host_alloc_min_bytes && length < host_alloc_min_bytes)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	__u32 tid = (__u32)id;
	struct host_alloc_args a = {.old_addr = ctx->args[0], .length = length, .op = GS_HOST_MREMAP};
	bpf_map_update_elem(&host_alloc_pending, &tid, &a, BPF_ANY);
	return 0;
}

static __always_inline int host_alloc_exit(long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct host_alloc_args *p = bpf_map_lookup_elem(&host_alloc_pending, &tid);
	if (!p)
		return 0;
	struct host_alloc_args a = *p;
	bpf_map_delete_elem(&host_alloc_pending, &tid);
	if (ret < 0 && ret > -4096)  /* failed: MAP_FAILED is -errno */
		return 0;
	send_host_alloc(id, a.op, (__u64)ret, a.length, a.old_addr, 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_mmap")
int host_mmap_exit(struct trace_event_raw_sys_exit *ctx)
{
	return host_alloc_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_mremap")
int host_mremap_exit(struct trace_event_raw_sys_exit *ctx)
{
	return host_alloc_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_enter_munmap")
int host_munmap_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 length = ctx->args[1];
	if (length < host_alloc_min_bytes)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	send_host_alloc(id, GS_HOST_MUNMAP, ctx->args[0], length, 0, 0);
	return 0;
}

/* Heap blocks: the C library serves large allocations from its heap, with no mmap, once it has
 * raised its mmap threshold (up to 32 MiB, as it does when such blocks are freed). The heap hooks
 * of libgpuscope_launches.so (preloaded into a command gpuscope starts) hand each large block to
 * gpuscope_heap_alloc(ptr, bytes, unrecorded) and its freeing to gpuscope_heap_free(ptr), both
 * probed here; the hooks filter by size and limit their rate themselves. */
SEC("uprobe")
int host_heap_alloc(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	send_host_alloc(id, GS_HOST_MALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, (__u32)PT_REGS_PARM3(ctx));
	return 0;
}

SEC("uprobe")
int host_heap_free(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	send_host_alloc(id, GS_HOST_FREE, PT_REGS_PARM1(ctx), 0, 0, 0);
	return 0;
}
