/* SPDX-License-Identifier: GPL-2.0 */
/* Records of host_allocs.bpf.c: large anonymous mappings of target processes, the stack that
 * made each, their unmapping and moves. Included by events.h. */
#ifndef GPUSCOPE_HOST_ALLOC_EVENTS_H
#define GPUSCOPE_HOST_ALLOC_EVENTS_H

enum gs_host_alloc_op {
	GS_HOST_MMAP = 1,    /* addr, length: mapped; its stack follows */
	GS_HOST_MUNMAP = 2,  /* addr, length: unmapped */
	GS_HOST_MREMAP = 3,  /* old_addr moved or resized to addr, length */
};

struct gs_host_alloc_record {
	__u16 kind;          /* GS_REC_HOST_ALLOC */
	__u16 op;            /* enum gs_host_alloc_op */
	__u32 pad;
	__u64 addr;
	__u64 length;
	__u64 old_addr;      /* GS_HOST_MREMAP: where it was */
	/* The thread, the time and its stacks (stack.s.kind = GS_REC_HOST_ALLOC): a GS_HOST_MMAP
	 * carries the copy of the user stack (the whole gs_sample_stack_record); the others end
	 * after stack.s, with no stack. */
	struct gs_sample_stack_record stack;
};

#endif
