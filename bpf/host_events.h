/* Host telemetry's records (host.bpf.c): how each thread of a target spent its time, measured in
 * the kernel from the scheduler's tracepoints and sent at the first switch or wake-up past a
 * window of GS_THREAD_WINDOW_NS (never a record per context switch), and at its exit.
 * Included by events.h, whose conventions it follows. */
#ifndef GPUSCOPE_BPF_HOST_EVENTS_H
#define GPUSCOPE_BPF_HOST_EVENTS_H

#define GS_THREAD_WINDOW_NS 10000000ULL
/* A thread that keeps its CPU sends its window at a CPU profile sample once it is this long: what it
 * does now is known to within it (diagnose/analysis.cpp lets a last state stand 60 ms), at a fifth of
 * the records a window per sample would cost at 100 Hz. */
#define GS_SAMPLED_WINDOW_NS 50000000ULL
#define GS_HOST_PIDS (1 << 22)  /* PID_MAX_LIMIT on 64-bit kernels */

/* Where a thread's time went. A thread off its CPU is runnable (woken or preempted, waiting for a
 * CPU) or blocked, and blocked time is told apart by the sleep's kind and the system call it sleeps
 * in. */
enum gs_thread_state {
	GS_TS_ON_CPU,
	GS_TS_RUNNABLE,
	GS_TS_BLOCKED_IO,     /* uninterruptible: disk I/O, a file page, memory reclaim, fsync */
	GS_TS_BLOCKED_LOCK,   /* in futex: a lock or a condition variable (the GIL, a queue) */
	GS_TS_BLOCKED_FD,     /* in read, recv, poll, select, epoll, accept, connect: a pipe, socket or file */
	GS_TS_BLOCKED_SLEEP,  /* in nanosleep or clock_nanosleep */
	GS_TS_BLOCKED_OTHER,  /* any other wait (wait4, a signal, a page fault on a swapped page...) */
	GS_TS_NR,
};

struct gs_thread_time_record {
	__u16 kind;           /* GS_REC_THREAD_TIME */
	__u16 flags;          /* GS_TT_* */
	__u32 pid;            /* thread group id */
	__u32 tid;
	__u32 switches;       /* times it left a CPU in the window */
	__u64 start_ns;       /* CLOCK_MONOTONIC; the window ends at end_ns */
	__u64 end_ns;
	__u64 ns[GS_TS_NR];   /* by gs_thread_state; they sum to end_ns - start_ns */
	/* Its longest wait for a CPU in the window, and the task that held that CPU when it got it
	 * back (tid 0: the CPU had gone idle while it was runnable: a CPU quota's throttling). */
	__u64 waited_ns;
	__u32 waited_for_tid;
	__u32 waited_for_pid;
	/* Its longest blocked stretch in the window, and who woke it from it (tid 0: an interrupt, or
	 * the idle task). */
	__u64 blocked_ns;
	__u32 waker_tid;
	__u32 waker_pid;
	__u32 preempted;      /* times it left a CPU while still runnable */
	__u32 faults;         /* user page faults */
	/* Its state at end_ns (gs_thread_state), in which it stays until its next window: a thread
	 * that runs without ever leaving its CPU sends none meanwhile. */
	__u32 state;
	/* Network softirqs (NET_RX, NET_TX) the kernel ran on its CPU while it was there, in µs: time
	 * charged to it as on-CPU that went to packets (a flood steered onto its CPU). */
	__u32 net_softirq_us;
	/* Reclaiming memory itself (direct reclaim: the host, or its cgroup, short of memory), on a
	 * CPU or blocked: part of the states' time, not beside it. */
	__u64 reclaim_ns;
	/* Its longest blocked stretch (blocked_ns) was in this system call (-1: none, a page fault),
	 * on this file descriptor (-1: the call takes none): user space names the file or socket. */
	__s32 blocked_syscall;
	__s32 blocked_fd;
	/* Of its on-CPU time, what the kernel accounted as system time (task_struct.stime: exact with
	 * VIRT_CPU_ACCOUNTING, else sampled at each tick; at most ns[GS_TS_ON_CPU], a tick's excess
	 * carried to the next window): system calls, page faults. */
	__u64 sys_ns;
	char comm[GS_COMM_LEN];
	char waited_for_comm[GS_COMM_LEN];
	char waker_comm[GS_COMM_LEN];
};

enum gs_thread_time_flags {
	GS_TT_EXITED = 1 << 0,   /* the thread's last window: it exited at end_ns */
	GS_TT_JOINED = 1 << 1,   /* its first window: its time before start_ns was not seen */
	GS_TT_WAITED_FOR_KTHREAD = 1 << 2,  /* waited_for_tid is a kernel thread (kworker, kswapd...) */
};

GS_ASSERT_SIZE(struct gs_thread_time_record, 208);
GS_ASSERT_AT(struct gs_thread_time_record, ns, 32);

#endif
