// SPDX-License-Identifier: GPL-2.0
/* What each part of gpuscope's launch probe (call_entry_emit, no stack taken) costs, on the
 * machine and in the workload where it runs: one program per stage, each doing what the one
 * before it did and one thing more. bench/probe_parts.cpp attaches them one at a time to the
 * same functions of a running process and reads their run time from bpf_prog_info. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "events.h"
#include "call_record.bpf.h"

const volatile __u64 wakeup_bytes = 16 << 20;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sink SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} marks SEC(".maps");

__u32 every[4096];  /* as gpuscope's stack_every (.bss), read at each call */

/* A launch record of what a launch needs and nothing more: 96 bytes against gs_call_record's 296. */
struct small_record {
	__u16 kind;
	__u16 func;
	__u32 flags;
	__u64 ts_ns;
	__u32 pid;
	__u32 tid;
	__u64 args[GS_NUM_ARGS - 1];
};

SEC("uprobe")
int p0_empty(struct pt_regs *ctx)
{
	return 0;
}

/* Whose call, which function, when. */
static __always_inline bool head(struct pt_regs *ctx, __u64 *id, __u64 *cookie, __u64 *ts)
{
	*id = bpf_get_current_pid_tgid();
	__u32 tgid = *id >> 32;
	if (!bpf_map_lookup_elem(&targets, &tgid))
		return false;
	*cookie = bpf_get_attach_cookie(ctx);
	*ts = bpf_ktime_get_ns();
	return true;
}

static __always_inline void keep(__u64 v)
{
	__u32 zero = 0;
	__u64 *s = bpf_map_lookup_elem(&sink, &zero);
	if (s)
		*s += v;
}

SEC("uprobe")
int p1a_filter(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	keep(bpf_map_lookup_elem(&targets, &tgid) != NULL);
	return 0;
}

SEC("uprobe")
int p1b_clock(struct pt_regs *ctx)
{
	keep(bpf_ktime_get_ns());
	return 0;
}

SEC("uprobe")
int p1c_cookie(struct pt_regs *ctx)
{
	keep(bpf_get_attach_cookie(ctx));
	return 0;
}

SEC("uprobe")
int p1_filter_clock(struct pt_regs *ctx)
{
	__u64 id, cookie, ts;
	__u32 zero = 0;
	if (!head(ctx, &id, &cookie, &ts))
		return 0;
	__u64 *s = bpf_map_lookup_elem(&sink, &zero);
	if (s)
		*s += ts ^ cookie;
	return 0;
}

enum stage { RESERVE, FILL, STACK_ARGS, COMM, QUERY, MARKS };

/* The thread's marks and the sampling choice, as call_entry_emit reads them. */
static __always_inline __u32 marks_and_sampling(__u64 id)
{
	__u32 flags = 0;
	__u64 *m = bpf_task_storage_get(&marks, bpf_get_current_task_btf(), 0, 0);
	if (m && *m)
		flags |= 1;
	__u32 n = every[(id >> 32) & 4095];
	if (n > 1 && bpf_get_prandom_u32() % n)
		flags |= 2;
	return flags;
}

/* gs_call_record's fields as call_entry_emit fills them (its pieces: call_record.bpf.h), from
 * FILL on up to `last`; before FILL only the head (no flags). */
static __always_inline void fill(struct pt_regs *ctx, struct gs_call_record *r, __u64 id, __u64 cookie,
				 __u64 ts, __u32 flags, enum stage last)
{
	call_record_head(r, id, cookie, last >= FILL ? flags : 0, ts, 0);
	if (last >= FILL) {
		r->ret = 0;
		r->out_value = 0;
		read_reg_args(ctx, r->args);
		r->deref_len = 0;
		r->stack_weight = 0;
		r->py_stack = 0;
		r->native_stack = 0;
	}
	if (last >= STACK_ARGS)
		read_stack_args(ctx, r->args);
	if (last >= COMM)
		bpf_get_current_comm(r->comm, sizeof(r->comm));
}

/* gs_call_record as call_entry_emit sends it, up to `last`. */
static __always_inline int full_record(struct pt_regs *ctx, enum stage last)
{
	__u64 id, cookie, ts;
	if (!head(ctx, &id, &cookie, &ts))
		return 0;
	__u32 flags = last >= MARKS ? marks_and_sampling(id) : 0;
	struct gs_call_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r)
		return 0;
	fill(ctx, r, id, cookie, ts, flags, last);
	__u64 submit = BPF_RB_NO_WAKEUP;
	if (last >= QUERY && bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		submit = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(r, submit);
	return 0;
}

/* Records gathered per CPU and sent BATCH at a time: what batching would save on the record's
 * memory, the ring's lock and its positions' cache lines. Measures the cost only: a program
 * preempted mid-record would share its CPU's batch with the next (not safe to record with). */
#define BATCH 16
struct batch {
	__u32 n;
	__u32 pad;
	struct gs_call_record rec[BATCH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct batch);
} batches SEC(".maps");

SEC("uprobe")
int b7_percpu_batch(struct pt_regs *ctx)
{
	__u64 id, cookie, ts;
	if (!head(ctx, &id, &cookie, &ts))
		return 0;
	__u32 flags = marks_and_sampling(id);
	__u32 zero = 0;
	struct batch *b = bpf_map_lookup_elem(&batches, &zero);
	if (!b)
		return 0;
	__u32 i = b->n;
	if (i >= BATCH)
		i = 0;
	fill(ctx, &b->rec[i], id, cookie, ts, flags, COMM);
	b->n = ++i;
	if (i == BATCH) {
		__u64 submit = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
											   : BPF_RB_NO_WAKEUP;
		bpf_ringbuf_output(&events, b->rec, sizeof(b->rec), submit);
		b->n = 0;
	}
	return 0;
}

SEC("uprobe")
int p2_reserve_submit(struct pt_regs *ctx) { return full_record(ctx, RESERVE); }
SEC("uprobe")
int p3_fill(struct pt_regs *ctx) { return full_record(ctx, FILL); }
SEC("uprobe")
int p4_stack_args(struct pt_regs *ctx) { return full_record(ctx, STACK_ARGS); }
SEC("uprobe")
int p5_comm(struct pt_regs *ctx) { return full_record(ctx, COMM); }
SEC("uprobe")
int p6_query(struct pt_regs *ctx) { return full_record(ctx, QUERY); }
SEC("uprobe")
int p7_marks_sampling(struct pt_regs *ctx) { return full_record(ctx, MARKS); }

/* The same as p4 into the small record. */
SEC("uprobe")
int s4_small_stack_args(struct pt_regs *ctx)
{
	__u64 id, cookie, ts;
	if (!head(ctx, &id, &cookie, &ts))
		return 0;
	struct small_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r)
		return 0;
	r->kind = GS_REC_CALL;
	r->func = cookie & 0xffff;
	r->flags = 0;
	r->ts_ns = ts;
	r->pid = id >> 32;
	r->tid = (__u32)id;
	r->args[0] = ctx->di;
	r->args[1] = ctx->si;
	r->args[2] = ctx->dx;
	r->args[3] = ctx->cx;
	r->args[4] = ctx->r8;
	r->args[5] = ctx->r9;
	bpf_probe_read_user(&r->args[GS_NUM_REG_ARGS], (GS_NUM_ARGS - 1 - GS_NUM_REG_ARGS) * sizeof(__u64),
			    (void *)(ctx->sp + 8));
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
