// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. Copies of the top of a user stack and its registers, unwound in user space
 * (--call-stacks dwarf, --sample-unwind dwarf, and walks whose table is not made yet). */

/* A stack copy read a page at a time, with room for a whole page past its end (the verifier
 * bounds each read's offset and size apart). */
struct stack_pages {
	__u8 data[GS_STACK_COPY + GS_STACK_COPY_CHUNK];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_pages);
} stack_pages_scratch SEC(".maps");

/* The most of the user stack above sp that can be read, up to the end of the thread's stack
 * where that is nearer (a main thread's outermost frames, main and the C library's start, lie
 * just below it). A read fails as a whole when any page of it cannot be read without a fault:
 * past the end of the stack's mapping, or a page of the stack the thread never touched (the
 * unused part of a big frame's locals: CPython's main thread has them). Then the copy is read a
 * page at a time: a page that cannot be read is a hole (bit i of *holes: piece i, the part of
 * sp's page above sp, then the pages after it), which user space fills; the copy ends after the
 * last page read. */
static __always_inline __u32 copy_user_stack(__u8 *dst, __u64 sp, __u16 *holes)
{
	__u64 end = thread_stack_end(sp);
	__u32 want = GS_STACK_COPY;
	*holes = 0;
	if (end > sp && end - sp < GS_STACK_COPY)
		want = end - sp;
	if (want <= GS_STACK_COPY && !bpf_probe_read_user(dst, want, (void *)sp))
		return want;
	__u32 zero = 0;
	struct stack_pages *t = bpf_map_lookup_elem(&stack_pages_scratch, &zero);
	if (!t)
		return 0;
	const __u32 first = GS_STACK_COPY_CHUNK - (sp & (GS_STACK_COPY_CHUNK - 1));
	__u32 len = 0, off = 0;
	__u16 missing = 0;
	/* A bounded loop (the asm barriers keep clang from unrolling it). */
	for (__u32 i = 0; i <= GS_STACK_COPY / GS_STACK_COPY_CHUNK; i++) {
		if (off >= want)
			break;
		__u32 n = i == 0 ? first : GS_STACK_COPY_CHUNK;
		if (n > want - off)
			n = want - off;
		/* In forms the verifier bounds: off < GS_STACK_COPY, n in 1..GS_STACK_COPY_CHUNK. */
		asm volatile("" : "+r"(n), "+r"(off));
		off &= GS_STACK_COPY - 1;
		n = ((n - 1) & (GS_STACK_COPY_CHUNK - 1)) + 1;
		if (bpf_probe_read_user(t->data + off, n, (void *)(sp + off)))
			missing |= 1 << i;
		else
			len = off + n;
		off += n;
	}
	/* Pages past the last one read are past the stack's end (its mapping's, when the end was
	 * not known), not holes. */
	for (__u32 i = GS_STACK_COPY / GS_STACK_COPY_CHUNK + 1; i > 0; i--) {
		if (!(missing & (1 << (i - 1))))
			break;
		missing &= ~(1 << (i - 1));
	}
	*holes = missing;
	/* The whole buffer (a constant size the verifier takes): what lies past len is not sent. */
	if (!len || bpf_probe_read_kernel(dst, GS_STACK_COPY, t->data))
		return 0;
	return len;
}

/* What user space needs to unwind a thread from .eh_frame: the user-mode registers the call
 * frame information can refer to, and the top of the stack. Returns the bytes copied. */
static __always_inline __u32 copy_user_state(struct gs_user_regs *dst, __u8 *stack, struct pt_regs *regs,
					     __u16 *holes)
{
	dst->ip = BPF_CORE_READ(regs, ip);
	dst->sp = BPF_CORE_READ(regs, sp);
	dst->bp = BPF_CORE_READ(regs, bp);
	dst->bx = BPF_CORE_READ(regs, bx);
	dst->r12 = BPF_CORE_READ(regs, r12);
	dst->r13 = BPF_CORE_READ(regs, r13);
	dst->r14 = BPF_CORE_READ(regs, r14);
	dst->r15 = BPF_CORE_READ(regs, r15);
	return copy_user_stack(stack, dst->sp, holes);
}
