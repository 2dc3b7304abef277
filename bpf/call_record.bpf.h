// SPDX-License-Identifier: GPL-2.0
/* A CUDA call's record as the call probes fill it: what every record starts with and the
 * arguments. Part of gpuscope.bpf.c (through calls.bpf.c), and included by bench/probe_parts.bpf.c,
 * which times each stage of the launch probe with the real pieces. Needs events.h. */
#ifndef GPUSCOPE_BPF_CALL_RECORD_H
#define GPUSCOPE_BPF_CALL_RECORD_H

/* x86-64 System V: rdi, rsi, rdx, rcx, r8, r9. */
static __always_inline void read_reg_args(struct pt_regs *ctx, __u64 *args)
{
	args[0] = ctx->di;
	args[1] = ctx->si;
	args[2] = ctx->dx;
	args[3] = ctx->cx;
	args[4] = ctx->r8;
	args[5] = ctx->r9;
}

/* At a function's first instruction sp points at the return address; the 7th argument and on
 * follow it. */
static __always_inline void read_stack_args(struct pt_regs *ctx, __u64 *args)
{
	bpf_probe_read_user(&args[GS_NUM_REG_ARGS], (GS_NUM_ARGS - GS_NUM_REG_ARGS) * sizeof(__u64),
			    (void *)(ctx->sp + 8));
}

static __always_inline void read_args(struct pt_regs *ctx, __u64 *args)
{
	read_reg_args(ctx, args);
	read_stack_args(ctx, args);
}

/* What every call record starts with; `duration_ns` 0 for an entry-only record. */
static __always_inline void call_record_head(struct gs_call_record *r, __u64 id, __u64 cookie, __u32 flags,
					     __u64 ts_ns, __u64 duration_ns)
{
	r->kind = GS_REC_CALL;
	r->func = GS_COOKIE_FUNC(cookie);
	r->flags = flags;
	r->ts_ns = ts_ns;
	r->duration_ns = duration_ns;
	r->pid = id >> 32;
	r->tid = (__u32)id;
}

#endif
