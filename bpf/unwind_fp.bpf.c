// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. */

/* ---- stacks walked here along frame pointers (--call-stacks fp, and code without tables) ----
 * The kernel's walk (bpf_get_stackid with BPF_F_USER_STACK) reads each frame apart: ~50 ns a
 * frame in a uprobe on the dev VM, most of it a probe read's fixed cost, plus ~500 ns for the
 * stack map. This one reads the stack a page at a time through the chunk cache the table walk
 * uses, and sends each stack once per process. */

/* One frame: record its ip, step to its caller. */
static __always_inline long fp_frame_step(struct unwind_ctx *c)
{
	struct unwind_scratch *s = c->s;
	__u32 i;
	if (!unwind_push_frame(s, &i))
		return 1;
	if (i == 0 && s->at_entry) {
		/* A probe at a function's first instruction: the caller's frame is not made yet, and
		 * its return address is at sp (the kernel's walk adds it the same way). */
		if (unwind_read(s, c->k, s->sp, &s->ip))
			return unwind_stop(s, GS_LOST_UNWIND_READ);
		s->sp += 8;
		return s->ip ? 0 : unwind_stop(s, GS_LOST_NR);
	}
	/* rbp is 0 in the outermost frame (the C library's _start and thread start clear it). */
	if (!s->bp)
		return unwind_stop(s, GS_LOST_NR);
	return unwind_fp_step(s, c->k);
}

/* A frame-pointer step costs less than a bpf_loop iteration: several per iteration. */
static long fp_frame(__u32 iteration, struct unwind_ctx *c)
{
	for (int n = 0; n < WALK_PER_ITERATION; n++)
		if (fp_frame_step(c))
			return 1;
	return 0;
}

/* The user stack whose registers are `regs`, walked along frame pointers: its id (the stack sent
 * first if it is new), 0 if none. at_entry: regs are at a probed function's first instruction. */
static __always_inline __u64 fp_user_stack(struct pt_regs *regs, __u64 pid_tgid, __u32 slot, bool at_entry)
{
	__u32 tgid = pid_tgid >> 32;
	struct unwind_ctx c = {};
	if (!unwind_start(&c, regs, tgid, slot))
		return 0;
	struct unwind_scratch *s = c.s;
	s->at_entry = at_entry;
	bpf_loop(GS_MAX_NATIVE_DEPTH + 1, fp_frame, &c, 0);
	if (!s->rec.nr)
		return 0;
	struct unwind_stat_counts *st = unwind_stat_counts();
	if (st) {
		st->n[GS_UNWIND_STAT_FP_WALKS]++;
		st->n[GS_UNWIND_STAT_FP_FRAMES] += s->rec.nr;
		st->n[GS_UNWIND_STAT_FP_PAGES_READ] += s->pages_read;
	}
	/* A chain that ends in code without frame pointers is how this walk ends: not a loss. */
	__u32 flags = s->stop == GS_LOST_NR ? GS_NATIVE_COMPLETE : s->stop == GS_LOST_UNWIND_DEPTH ? 0 : GS_NATIVE_FP_END;
	return native_stack_id(s, tgid, flags, slot);
}
