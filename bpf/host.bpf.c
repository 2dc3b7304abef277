// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. Host telemetry: where each target thread's time goes (on a CPU, waiting
 * for one and behind whom, blocked and on what, woken by whom), summed here per thread and sent
 * once per window (host_events.h). Every context switch on the host runs this part's programs: for
 * a task that is not followed they test one bit (host_pids) and return. */

const volatile bool host_telemetry = false;

/* The processes whose threads are followed, a bit per tgid (GS_HOST_PIDS: the kernel's largest
 * pid_max): one load decides at every context switch, where a hash lookup for each of the two
 * tasks cost more than the rest of the program. Set by user space for the targets (with
 * filter_targets off, for the processes that use CUDA), here for their children, cleared at exit. */
volatile __u64 host_pids[GS_HOST_PIDS / 64];

/* The word of a pid's bit, masked in a register the compiler cannot reason about: it drops a
 * mask it proves redundant after a bounds check, and the verifier then sees no bound. */
static __always_inline volatile __u64 *host_word(__u32 pid)
{
	__u32 idx = pid / 64;
	asm volatile("" : "+r"(idx));
	return &host_pids[idx & (GS_HOST_PIDS / 64 - 1)];
}

static __always_inline bool host_followed(__u32 tgid)
{
	return tgid < GS_HOST_PIDS && (*host_word(tgid) & (1ULL << (tgid % 64)));
}

#define GS_PF_KTHREAD 0x00200000  /* task_struct.flags: a kernel thread (linux/sched.h) */

struct thread_time {
	__u64 start_ns;   /* the window's start */
	__u64 since_ns;   /* when `state` began */
	__u64 ns[GS_TS_NR];
	__u64 waited_ns;
	__u64 blocked_ns;
	__u32 waited_for_tid, waited_for_pid;
	__u32 waker_tid, waker_pid;
	__u32 switches, preempted, faults;
	__u32 state;
	__u16 flags;
	__u64 reclaim_ns;
	__u64 reclaim_since;  /* in a direct reclaim since then (0: not) */
	__u64 net_softirq_ns;
	__s32 sleep_syscall, sleep_fd;      /* what it blocked in last (at its switch out) */
	__s32 blocked_syscall, blocked_fd;  /* the same, for its longest blocked stretch */
	__u64 stime_start;  /* task_struct.stime at the window's start */
	char waited_for_comm[GS_COMM_LEN];
	char waker_comm[GS_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_time);
} thread_times SEC(".maps");

/* A followed thread's state (NULL for any other task); made when it is first seen, its first
 * window starting then (its time before is unknown). */
static __always_inline struct thread_time *thread_time_of(struct task_struct *task)
{
	if (!host_followed(task->tgid))
		return NULL;
	struct thread_time *t = bpf_task_storage_get(&thread_times, task, 0, 0);
	if (t)
		return t;
	t = bpf_task_storage_get(&thread_times, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (t) {
		__u64 now = bpf_ktime_get_ns();
		t->start_ns = now;
		t->since_ns = now;
		t->state = GS_TS_ON_CPU;
		t->flags = GS_TT_JOINED;
		t->stime_start = BPF_CORE_READ(task, stime);
	}
	return t;
}

/* A followed thread's state, without making one. */
static __always_inline struct thread_time *tracked_thread(struct task_struct *task)
{
	if (!host_followed(task->tgid))
		return NULL;
	return bpf_task_storage_get(&thread_times, task, 0, 0);
}

/* Charges the time since the state began to it; returns the instant charged to. A wake-up on one
 * CPU can run beside the thread's own switch out on another (try_to_wake_up fires sched_waking
 * before it waits for the task to be off its CPU), each with the clock it read: the later path
 * may hold the earlier instant. Time never goes back here, or the same nanoseconds would be
 * charged twice (windows whose states outgrow them). */
static __always_inline __u64 charge(struct thread_time *t, __u64 now)
{
	__u32 s = t->state;
	__u64 since = t->since_ns;
	if (now <= since)
		return since;
	if (s < GS_TS_NR)
		t->ns[s] += now - since;
	t->since_ns = now;
	return now;
}

/* Sends the window [start_ns, now) once it is long enough (or the thread is gone), and starts the
 * next. `now` has been charged. */
static __always_inline void send_window(struct thread_time *t, struct task_struct *task, __u64 now, bool exited)
{
	if (!exited && now - t->start_ns < GS_THREAD_WINDOW_NS)
		return;
	/* System time since the window began, at most its on-CPU time: where stime is sampled at ticks,
	 * a window may be charged a tick more than it ran; the rest carries to the next window. */
	__u64 stime = BPF_CORE_READ(task, stime);
	__u64 sys = stime > t->stime_start ? stime - t->stime_start : 0;
	if (sys > t->ns[GS_TS_ON_CPU])
		sys = t->ns[GS_TS_ON_CPU];
	__u64 stime_next = t->stime_start + sys;
	struct gs_thread_time_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (r) {
		r->kind = GS_REC_THREAD_TIME;
		r->flags = t->flags | (exited ? GS_TT_EXITED : 0);
		r->pid = BPF_CORE_READ(task, tgid);
		r->tid = BPF_CORE_READ(task, pid);
		r->switches = t->switches;
		r->start_ns = t->start_ns;
		r->end_ns = now;
		for (int i = 0; i < GS_TS_NR; i++)
			r->ns[i] = t->ns[i];
		r->waited_ns = t->waited_ns;
		r->waited_for_tid = t->waited_for_tid;
		r->waited_for_pid = t->waited_for_pid;
		r->blocked_ns = t->blocked_ns;
		r->waker_tid = t->waker_tid;
		r->waker_pid = t->waker_pid;
		r->preempted = t->preempted;
		r->faults = t->faults;
		r->state = t->state;
		r->net_softirq_us = t->net_softirq_ns / 1000;
		r->reclaim_ns = t->reclaim_ns;
		r->blocked_syscall = t->blocked_ns ? t->blocked_syscall : -1;
		r->blocked_fd = t->blocked_ns ? t->blocked_fd : -1;
		r->sys_ns = sys;
		BPF_CORE_READ_STR_INTO(&r->comm, task, comm);
		__builtin_memcpy(r->waited_for_comm, t->waited_for_comm, GS_COMM_LEN);
		__builtin_memcpy(r->waker_comm, t->waker_comm, GS_COMM_LEN);
		bpf_ringbuf_submit(r, submit_flags());
	} else {
		count_lost(GS_LOST_RINGBUF_FULL);
	}
	/* The state in progress carries over; the sums start again. */
	__u32 state = t->state;
	__u64 reclaim_since = t->reclaim_since;
	__s32 sleep_syscall = t->sleep_syscall, sleep_fd = t->sleep_fd;
	__builtin_memset(t, 0, sizeof(*t));
	t->reclaim_since = reclaim_since;
	t->sleep_syscall = sleep_syscall;
	t->sleep_fd = sleep_fd;
	t->stime_start = stime_next;
	t->start_ns = now;
	t->since_ns = now;
	t->state = state;
}

/* Whether an x86-64 system call's first argument is the file descriptor it may sleep on. */
static __always_inline bool fd_first(long nr)
{
	switch (nr) {
	case 0: case 1: case 3: case 17: case 18: case 19: case 20: /* read write close pread pwrite readv writev */
	case 42: case 43: case 44: case 45: case 46: case 47: /* connect accept sendto recvfrom sendmsg recvmsg */
	case 74: case 75: case 77: case 232: case 277: case 281: /* fsync fdatasync ftruncate epoll_wait
	                                                            sync_file_range epoll_pwait */
	case 288: case 295: case 296: case 299: case 307: case 441:
		/* accept4 preadv pwritev recvmmsg sendmmsg epoll_pwait2 */
		return true;
	}
	return false;
}

/* x86-64 system call numbers a thread sleeps in, by what it waits for; `t` keeps the call and its
 * file descriptor. */
static __always_inline __u32 blocked_state(struct thread_time *t, struct task_struct *task, unsigned int prev_state)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	long nr = regs ? BPF_CORE_READ(regs, orig_ax) : -1;
	t->sleep_syscall = nr;
	t->sleep_fd = fd_first(nr) ? (__s32)BPF_CORE_READ(regs, di) : -1;
	if (prev_state & 0x2 /* TASK_UNINTERRUPTIBLE */)
		return GS_TS_BLOCKED_IO;
	switch (nr) {
	case 202: /* futex */
	case 449: /* futex_waitv */
		return GS_TS_BLOCKED_LOCK;
	case 0: case 1: case 7: case 17: case 18: case 19: case 20: case 23: /* read write poll pread pwrite readv writev select */
	case 42: case 43: case 44: case 45: case 46: case 47: /* connect accept sendto recvfrom sendmsg recvmsg */
	case 232: case 270: case 271: case 281: case 288: case 295: case 296: case 299: case 441:
		/* epoll_wait pselect6 ppoll epoll_pwait accept4 preadv pwritev recvmmsg epoll_pwait2 */
		return GS_TS_BLOCKED_FD;
	case 35:  /* nanosleep */
	case 230: /* clock_nanosleep */
		return GS_TS_BLOCKED_SLEEP;
	}
	return GS_TS_BLOCKED_OTHER;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(host_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	if (!host_telemetry)
		return 0;
	struct thread_time *t = thread_time_of(prev);
	struct thread_time *n = thread_time_of(next);
	__u64 clock = 0;  /* read only for a target's thread */
	if (t) {
		clock = bpf_ktime_get_ns();
		__u64 now = charge(t, clock);
		t->switches++;
		if (preempt || prev_state == 0 /* TASK_RUNNING */) {
			t->state = GS_TS_RUNNABLE;
			t->preempted++;
		} else {
			t->state = blocked_state(t, prev, prev_state);
		}
		send_window(t, prev, now, false);
	}
	t = n;
	if (t) {
		if (!clock)
			clock = bpf_ktime_get_ns();
		__u64 since = t->since_ns;
		bool was_runnable = t->state == GS_TS_RUNNABLE;
		__u64 now = charge(t, clock);
		__u64 waited = now - since;
		/* The longest wait is charged to the task it got its CPU back from. */
		if (was_runnable && waited > t->waited_ns) {
			t->waited_ns = waited;
			t->waited_for_tid = BPF_CORE_READ(prev, pid);
			t->waited_for_pid = BPF_CORE_READ(prev, tgid);
			BPF_CORE_READ_STR_INTO(&t->waited_for_comm, prev, comm);
			if (BPF_CORE_READ(prev, flags) & GS_PF_KTHREAD)
				t->flags |= GS_TT_WAITED_FOR_KTHREAD;
			else
				t->flags &= ~GS_TT_WAITED_FOR_KTHREAD;
		}
		t->state = GS_TS_ON_CPU;
		send_window(t, next, now, false);
	}
	return 0;
}

/* A blocked thread becomes runnable; the running task woke it (or an interrupt did, on its CPU). */
static __always_inline void woken(struct task_struct *p)
{
	struct thread_time *t = tracked_thread(p);
	if (!t || t->state < GS_TS_BLOCKED_IO)
		return;
	__u64 since = t->since_ns;
	__u64 now = charge(t, bpf_ktime_get_ns());
	__u64 blocked = now - since;
	if (blocked > t->blocked_ns) {
		struct task_struct *waker = bpf_get_current_task_btf();
		t->blocked_ns = blocked;
		t->waker_tid = BPF_CORE_READ(waker, pid);
		t->waker_pid = BPF_CORE_READ(waker, tgid);
		BPF_CORE_READ_STR_INTO(&t->waker_comm, waker, comm);
		t->blocked_syscall = t->sleep_syscall;
		t->blocked_fd = t->sleep_fd;
	}
	t->state = GS_TS_RUNNABLE;
	send_window(t, p, now, false);
}

/* A profile sample interrupted a followed thread on its CPU. A thread that keeps its CPU has no
 * event to send its window at: without this, the state its last window ended in (preempted,
 * often) would stand for all the time it then ran. */
static __always_inline void host_sampled(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct thread_time *t = tracked_thread(task);
	if (!t || t->state != GS_TS_ON_CPU)
		return;
	__u64 now = bpf_ktime_get_ns();
	if (now - t->start_ns < GS_SAMPLED_WINDOW_NS)
		return;
	send_window(t, task, charge(t, now), false);
}

SEC("tp_btf/sched_waking")
int BPF_PROG(host_waking, struct task_struct *p)
{
	if (host_telemetry)
		woken(p);
	return 0;
}

/* Direct reclaim by a followed thread: the memory it asked for had to be freed first, by itself
 * (the host short of memory, or its cgroup at its limit). Rare; a few hundred ns each. */
static __always_inline void reclaim_begin(void)
{
	struct thread_time *t = tracked_thread(bpf_get_current_task_btf());
	if (t)
		t->reclaim_since = bpf_ktime_get_ns();
}

static __always_inline void reclaim_end(void)
{
	struct thread_time *t = tracked_thread(bpf_get_current_task_btf());
	if (t && t->reclaim_since) {
		t->reclaim_ns += bpf_ktime_get_ns() - t->reclaim_since;
		t->reclaim_since = 0;
	}
}

/* Network softirqs run on a followed thread's CPU while it is there (softirqs do not nest on a
 * CPU: one start per CPU). Every softirq on the host tests one bit; timers, RCU and the block
 * layer's are not looked at. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} net_softirq_since SEC(".maps");

#define GS_NET_TX_SOFTIRQ 2
#define GS_NET_RX_SOFTIRQ 3

SEC("tp_btf/softirq_entry")
int BPF_PROG(host_softirq_entry, unsigned int vec_nr)
{
	if (!host_telemetry || (vec_nr != GS_NET_RX_SOFTIRQ && vec_nr != GS_NET_TX_SOFTIRQ))
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	if (!host_followed(task->tgid))
		return 0;
	__u32 zero = 0;
	__u64 *since = bpf_map_lookup_elem(&net_softirq_since, &zero);
	if (since)
		*since = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(host_softirq_exit, unsigned int vec_nr)
{
	if (!host_telemetry || (vec_nr != GS_NET_RX_SOFTIRQ && vec_nr != GS_NET_TX_SOFTIRQ))
		return 0;
	__u32 zero = 0;
	__u64 *since = bpf_map_lookup_elem(&net_softirq_since, &zero);
	if (!since || !*since)
		return 0;
	__u64 began = *since;
	*since = 0;
	struct thread_time *t = tracked_thread(bpf_get_current_task_btf());
	if (t)
		t->net_softirq_ns += bpf_ktime_get_ns() - began;
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(host_reclaim_begin, int order, gfp_t gfp)
{
	if (host_telemetry)
		reclaim_begin();
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(host_reclaim_end, unsigned long reclaimed)
{
	if (host_telemetry)
		reclaim_end();
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(host_memcg_reclaim_begin, int order, gfp_t gfp)
{
	if (host_telemetry)
		reclaim_begin();
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(host_memcg_reclaim_end, unsigned long reclaimed)
{
	if (host_telemetry)
		reclaim_end();
	return 0;
}

SEC("tp_btf/page_fault_user")
int BPF_PROG(host_fault, unsigned long address, struct pt_regs *regs, unsigned long error_code)
{
	if (!host_telemetry)
		return 0;
	struct thread_time *t = tracked_thread(bpf_get_current_task_btf());
	if (t)
		t->faults++;
	return 0;
}

/* A followed process's child is followed too (a DataLoader worker), before it first runs. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(host_fork, struct task_struct *parent, struct task_struct *child)
{
	if (!host_telemetry)
		return 0;
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	if (ptgid == ctgid || !host_followed(ptgid) || ctgid >= GS_HOST_PIDS)
		return 0;
	__sync_fetch_and_or(host_word(ctgid), 1ULL << (ctgid % 64));
	return 0;
}

/* The tracepoint's later arguments differ between kernels; only the task is read. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(host_exit, struct task_struct *task)
{
	if (!host_telemetry)
		return 0;
	struct thread_time *t = tracked_thread(task);
	if (t) {
		__u64 now = charge(t, bpf_ktime_get_ns());
		send_window(t, task, now, true);
	}
	/* The process's last thread (signal->live was counted down before this tracepoint): before
	 * its pid can be given to another process. */
	__u32 tgid = task->tgid;
	if (BPF_CORE_READ(task, signal, live.counter) == 0 && tgid < GS_HOST_PIDS)
		__sync_fetch_and_and(host_word(tgid), ~(1ULL << (tgid % 64)));
	return 0;
}
