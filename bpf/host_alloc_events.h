/* SPDX-License-Identifier: GPL-2.0 */
/* Records of host_allocs.bpf.c: large anonymous mappings of target processes, the stack that
 * made each, their unmapping and moves; and large heap blocks, handed over by the heap hooks of
 * libgpuscope_launches.so (src/inject/heap_hooks.cpp). Included by events.h. */
#ifndef GPUSCOPE_HOST_ALLOC_EVENTS_H
#define GPUSCOPE_HOST_ALLOC_EVENTS_H

enum gs_host_alloc_op {
	GS_HOST_MMAP = 1,    /* addr, length: mapped; its stack follows */
	GS_HOST_MUNMAP = 2,  /* addr, length: unmapped */
	GS_HOST_MREMAP = 3,  /* old_addr moved or resized to addr, length */
	GS_HOST_MALLOC = 4,  /* addr, length: a heap block allocated (malloc and its kin); its stack follows */
	GS_HOST_FREE = 5,    /* addr: that block freed (or moved by realloc) */
};

struct gs_host_alloc_record {
	__u16 kind;          /* GS_REC_HOST_ALLOC */
	__u16 op;            /* enum gs_host_alloc_op */
	/* GS_HOST_MALLOC: large blocks the process allocated before this one and did not hand over
	 * (its hooks' rate limit, or their table of blocks full) */
	__u32 unrecorded;
	__u64 addr;
	__u64 length;
	__u64 old_addr;      /* GS_HOST_MREMAP: where it was */
	/* The thread, the time and its stacks (stack.s.kind = GS_REC_HOST_ALLOC): a GS_HOST_MMAP or
	 * GS_HOST_MALLOC carries the copy of the user stack (the whole gs_sample_stack_record); the
	 * others end after stack.s, with no stack. */
	struct gs_sample_stack_record stack;
};

#endif
