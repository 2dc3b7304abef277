// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. Configuration set by user space before load, the maps every part uses (targets,
 * pending calls, the ring buffer, lost counters), and the helpers they share. */

#define SIGSTOP 19
#define EFAULT 14

/* Set by user space between open and load, so the verifier prunes what is off. */
const volatile bool filter_targets = true;  /* false with --all */
/* The agent: every process is watched for CUDA, but only those added to `targets` (the ones
 * that use it) are sampled. */
const volatile bool sample_only_targets = false;
const volatile bool capture_stacks = true;
const volatile __u64 wakeup_bytes = 1 << 20;  /* wake the consumer only past this much data */
const volatile __u32 self_tgid = 0;           /* never trace gpuscope itself */
/* Stop a process while a shared object it loads is checked for a static CUDA runtime. Off
 * with --all: stopping every process on the host disturbs parents that watch for stops
 * (shells, supervisors); there the check runs while the process goes on. */
const volatile bool stop_for_shared_objects = true;
const volatile bool sample_stack_copy = false;  /* samples carry a user stack copy (dwarf unwinding) */
const volatile bool call_stack_copy = false;    /* --call-stacks dwarf: so do CUDA calls */
const volatile bool python_stacks = false;      /* walk Python frames of the processes in python_procs */
/* --call-stacks eh-frame / --sample-unwind eh-frame: user stacks walked here from the tables in
 * unwind_rows (see events.h), sent once per process as GS_REC_NATIVE_STACK. */
const volatile bool call_unwind_tables = false;
const volatile bool sample_unwind_tables = false;
/* The walker's code takes the verifier far longer than the rest (~0.2-0.5 s a call program
 * against ~10 ms), so the call programs attached at start come without it (call_tables_later):
 * they send stacks as copies, and user space loads them again, with the walker, in the
 * background and puts them in upgrade_calls, to which the first ones hand every run from then on
 * (one tail call). walker_failed: set by user space when that load failed: frame-pointer walks
 * instead. */
const volatile bool call_tables_later = false;
volatile bool walker_failed;
#define UPGRADE_EMIT 0
#define UPGRADE_ENTRY 1
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} upgrade_calls SEC(".maps");
/* --stack-every N: stacks of launches, copies and memsets (the calls that come by the thousand
 * a second) are taken for one in N, chosen at random so that no periodic pattern of calls is
 * missed; user space weighs each taken stack by N. 1: every call. */
const volatile __u32 stack_every = 1;
/* --stack-budget: instead, N is each process's entry in stack_rates (none: 1), which user space
 * sets from what the process's walks cost (stack_costs) to keep them within a share of its time. */
const volatile bool stack_budget = false;

/* By tgid % GS_STACK_RATE_SLOTS, written whole by user space through the skeleton's mapping of
 * .bss: read at every launch, copy and memset, with a plain load instead of a hash lookup. A slot
 * holding another process's tgid means N = 1. */
volatile __u64 stack_rates[GS_STACK_RATE_SLOTS];
/* Functions whose probes user space is removing (BpfSession::detach_runtime_functions), a bit
 * per id: the entry's link goes first, so a return may still come without its entry. */
volatile __u64 retiring_funcs[4];

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);  /* tgid */
	__type(value, struct gs_stack_cost);
} stack_costs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);  /* resized by user space */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);   /* tgid, or tid of a thread created by a target */
	__type(value, __u8);
} targets SEC(".maps");

struct pending_call {
	__u64 ts_ns;
	__u64 py_stack;
	__u64 native_stack;
	__u32 deref_len;
	__u32 flags;
	__u32 nested;  /* entries of the same function inside this call (see call_entry) */
	__u32 stack_weight;  /* see gs_call_record */
	__u64 args[GS_NUM_ARGS];
	__u8 deref[GS_DEREF_LONG_LEN];  /* past GS_DEREF_LEN only for 3-D copy descriptors */
};

/* An entry of a function already pending on the thread, started this recently, is a call
 * nested in it, not a stale entry whose return was missed. */
#define GS_NESTED_CALL_NS 10000000ULL

/* A thread's calls entered and not yet returned: runtime and driver calls nest, and a call
 * whose return was missed (its probes removed meanwhile) leaves its slot until the function is
 * entered again. Task storage, not a hash keyed by thread and function: the hash's update and
 * delete were about half of a return-probed call's BPF time on the dev VM. */
#define PENDING_SLOTS 8
struct pending_thread {
	struct pending_call call[PENDING_SLOTS];
	__u32 tag[PENDING_SLOTS];  /* pending_tag(); 0: free */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending_thread);
} pending SEC(".maps");

/* A pending call's tag: its function id + 1, with this bit for a runtime API function. */
#define PENDING_RUNTIME (1U << 31)

static __always_inline __u32 pending_tag(__u64 cookie)
{
	return (GS_COOKIE_FUNC(cookie) + 1) | (GS_COOKIE_RUNTIME(cookie) ? PENDING_RUNTIME : 0);
}

/* The slot of a pending call of function `tag` on this thread (0: a free slot), or -1. */
static __always_inline int pending_slot(struct pending_thread *t, __u32 tag)
{
	for (int i = 0; i < PENDING_SLOTS; i++)
		if (t->tag[i] == tag)
			return i;
	return -1;
}

/* --stack-every or --stack-budget: whether this call's stack is left out, its record flagged
 * either way, and a taken one's weight set. */
static __always_inline bool stack_sampled_out(__u64 cookie, __u32 tgid, __u32 *flags, __u32 *weight)
{
	if (!capture_stacks || !GS_COOKIE_SAMPLED_STACK(cookie))
		return false;
	__u32 every = stack_every;
	if (stack_budget) {
		__u64 rate = stack_rates[tgid & (GS_STACK_RATE_SLOTS - 1)];
		every = GS_STACK_RATE_TGID(rate) == tgid ? GS_STACK_RATE_EVERY(rate) : 1;
	}
	if (every <= 1)
		return false;
	if (bpf_get_prandom_u32() % every) {
		*flags |= GS_CALL_STACK_SAMPLED_OUT;
		return true;
	}
	*flags |= GS_CALL_STACK_SAMPLED;
	*weight = every;
	return false;
}

/* --stack-budget: charges a sampled call's walks, from the probe's entry at t0, to its process.
 * A global function, verified apart: inlined after the walks, it multiplied the states the
 * verifier explores past its limit. */
__noinline int charge_stack_walks(__u64 cookie, __u32 tgid, __u64 t0)
{
	if (!stack_budget || !capture_stacks || !(GS_COOKIE_SAMPLED_STACK(cookie) || GS_COOKIE_CHOSEN_STACK(cookie)))
		return 0;
	struct gs_stack_cost *c = bpf_map_lookup_elem(&stack_costs, &tgid);
	if (!c) {
		struct gs_stack_cost first = {.first_ns = t0};
		bpf_map_update_elem(&stack_costs, &tgid, &first, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&stack_costs, &tgid);
		if (!c)
			return 0;  /* full: the process's stacks stay at its last N */
	}
	c->walk_ns += bpf_ktime_get_ns() - t0;
	c->walks++;
	return 0;
}

/* What a thread's next launch needs to know. Task storage, not a hash: an LRU hash update was
 * 200-350 ns of a runtime launch's probe on the dev VM (519-698 ns without stacks, 327-334 ns
 * with task storage). */
struct thread_marks {
	/* Entry time of a runtime launch, until the driver launch it makes clears it (0: none).
	 * That driver launch has the same stack plus a few runtime frames, so it skips the walk (the
	 * costliest part of a probe) and user space gives it its parent's stack. */
	__u64 rt_launch_ns;
	/* A kernel lookup whose result is read at the thread's next launch or lookup
	 * (GS_COOKIE_OUT_LATER: cuKernelGetFunction, which cuBLASLt calls before each of its
	 * launches): its record is sent then, with the handle found at its out-pointer, instead of
	 * at a return probe, one trap fewer a lookup. 0: none waiting. */
	__u64 later_ts;
	__u64 later_out;      /* the out-pointer */
	__u64 later_args[2];  /* its first two arguments (the out-pointer, the handle looked up) */
	__u64 later_cookie;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_marks);
} thread_marks SEC(".maps");

/* A runtime launch reaches the driver within microseconds; older marks are stale (the
 * launch failed before reaching it). */
#define RUNTIME_TO_DRIVER_NS 200000

/* Kernel stacks of CPU samples (user stacks are walked here: see fp_user_stack). Two
 * generations of stack maps (see GS_STACK_GEN_BIT): captures go to the one stack_gen names; user
 * space empties the other. Both resized by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, GS_MAX_STACK_DEPTH * sizeof(__u64));
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, GS_MAX_STACK_DEPTH * sizeof(__u64));
} stacks_alt SEC(".maps");

/* Written by user space while the programs run (the skeleton's mmapped .bss), so read at
 * every capture: 0 captures into `stacks`, 1 into `stacks_alt`. */
volatile __u32 stack_gen = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GS_LOST_NR);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* openat of a CUDA library (or of a shared object not yet checked) by a target: the path,
 * kept until that fd is closed. */
struct lib_open {
	char path[GS_PATH_LEN];
	__u32 cuda_name;
};

/* Shared objects user space has already checked for a statically linked CUDA runtime. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct gs_file_key);
	__type(value, __u8);
} checked_files SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);  /* tid */
	__type(value, __u64); /* user pointer to the path being opened */
} openat_args SEC(".maps");

/* Processes stopped at a library's load, counted (libload.bpf.c), and the stops user space has
 * answered with SIGCONT. A guardian process holds both maps (attach/stop_guardian.h): if
 * gpuscope dies (kill -9, a crash, the OOM killer), it continues every process with more stops
 * made than answered. Counts, not a set that user space empties as it answers: a process
 * continued may be stopped again at its next library before the answer's removal would land,
 * and would then be stopped unlisted. Removed at the process's end (procs.bpf.c). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct gs_stop_count);
} stops_made SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct gs_stop_count);
} stops_answered SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);  /* tgid << 32 | fd */
	__type(value, struct lib_open);
} lib_fds SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lib_open);
} path_scratch SEC(".maps");

static __always_inline void count_lost(__u32 cause)
{
	__u64 *v = bpf_map_lookup_elem(&lost, &cause);
	if (v)
		*v += 1;
}

/* bpf_get_stackid into the current generation's map, the id tagged with that generation.
 * The verifier needs a constant map pointer at each call: one call per map. Records take
 * their ts_ns before their stacks: user space tells an id captured before it emptied that
 * generation's map by the record's time. */
static __always_inline long get_stackid(void *ctx, __u64 flags)
{
	if (stack_gen) {
		long id = bpf_get_stackid(ctx, &stacks_alt, flags);
		return id < 0 ? id : id | GS_STACK_GEN_BIT;
	}
	return bpf_get_stackid(ctx, &stacks, flags);
}

/* Target processes by tgid % GS_TARGET_SLOTS, so that a probe finds its own with one load
 * instead of a hash lookup (a hash lookup was ~58 ns of a launch probe on the H100). A slot
 * holds one tgid, set by user space (BpfSession::add_target) and cleared where the process leaves
 * (on_exit, remove_target); a target that shares a slot, or a child followed by on_fork, is
 * found in `targets`. A slot never holds a process that is not a target. */
volatile __u32 target_slots[GS_TARGET_SLOTS];

static __always_inline bool is_target(__u32 tgid)
{
	if (tgid == self_tgid)
		return false;
	if (!filter_targets)
		return true;
	if (target_slots[tgid & (GS_TARGET_SLOTS - 1)] == tgid)
		return true;
	return bpf_map_lookup_elem(&targets, &tgid) != NULL;
}

/* Records are submitted without waking the consumer, which collects them every few ms, except
 * once the data waiting passes wakeup_bytes: that record wakes it, and no other until user space
 * has consumed the ring again and cleared wakeup_sent. A wake-up queues an irq_work; forcing one
 * at every record while the consumer caught up cost ~110 ns a record on the dev VM at 400k a second. */
volatile __u32 wakeup_sent = 0;

static __always_inline __u64 submit_flags(void)
{
	if (wakeup_sent || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) < wakeup_bytes)
		return BPF_RB_NO_WAKEUP;
	wakeup_sent = 1;
	return BPF_RB_FORCE_WAKEUP;
}
