// SPDX-License-Identifier: GPL-2.0
/* gpuscope's kernel side: uprobes on CUDA API functions and the tracepoints that follow
 * target processes and catch CUDA libraries as they are loaded.
 *
 * Every program does the least it can: filter by target, copy registers, reserve,
 * submit. Decoding arguments is user space's job (src/decode). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "events.h"

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
	if (!stack_budget || !capture_stacks || !GS_COOKIE_SAMPLED_STACK(cookie))
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

/* ---- stacks walked from .eh_frame tables (events.h: gs_unwind_row) ---- */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);  /* resized by user space: the cap on table memory */
	__uint(map_flags, BPF_F_MMAPABLE);  /* user space writes tables in place */
	__type(key, __u32);
	__type(value, struct gs_unwind_row);
} unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);  /* 16 KiB a process: only for those that have one */
	__type(key, __u32);  /* tgid */
	__type(value, struct gs_unwind_proc);
} unwind_procs SEC(".maps");

/* Stacks user space has been sent (their id hashes the process in): a stack costs a record once. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} native_stacks_sent SEC(".maps");

struct unwind_stat_counts {
	__u64 n[GS_UNWIND_STAT_NR];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_stat_counts);
} unwind_stats SEC(".maps");

static __always_inline struct unwind_stat_counts *unwind_stat_counts(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&unwind_stats, &zero);
}

/* Processes whose walks met code in no mapping of their table, or that have no table yet
 * (forked children, processes found late): user space reads their mappings again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);  /* tgid */
	__type(value, __u8);
} unwind_wanted SEC(".maps");

/* Files whose table a walk needed while it was pending (gs_unwind_mapping_flags): user space
 * compiles them and takes the request away once the table is on its way. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct gs_unwind_file_want);
	__type(value, __u8);
} unwind_files_wanted SEC(".maps");

/* The walk reads the stack a page at a time: a probe read's cost is mostly fixed (measured: the
 * reads were most of a frame's cost when each word was read apart), and a page holds several
 * frames. A page of the stack is mapped whole, so reading one is no likelier to fail than a word. */
#define UNWIND_CHUNK 4096
#define UNWIND_NEAR_PAGES 4

/* Two chunks per CPU, indexed by CPU * 2 + UNWIND_SLOT_*, in an array sized by user space (one
 * chunk when no stack is taken). A CPU sample's program runs from the timer interrupt and can
 * interrupt a uprobe's mid-walk on the same CPU (uprobe-multi programs do not hold off other BPF
 * programs): each has its own chunk and scratch, here and in the Python walk, so neither
 * overwrites the other's. */
#define UNWIND_SLOT_CALL 0
#define UNWIND_SLOT_SAMPLE 1
struct unwind_chunk {
	__u8 b[UNWIND_CHUNK];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);  /* resized by user space: CPUs, with tables */
	__type(key, __u32);
	__type(value, struct unwind_chunk);
} unwind_chunks SEC(".maps");

struct unwind_scratch {
	struct gs_native_stack_record rec;
	__u64 ip, sp, bp;
	__u64 hash;
	__u32 bp_known;    /* 0: rbp unknown; 1: in bp; BP_SAVED: saved at the stack address in bp */
	__u32 stop;        /* a GS_LOST_UNWIND_* cause, or GS_LOST_NR: not stopped yet / ended whole */
	__u16 fp_steps;    /* frames stepped with frame pointers */
	__u16 unmapped;    /* of which in no mapping of the table */
	__u32 last_map;    /* the mapping the last frame was in: callers are often in the same file */
	__u32 at_entry;    /* frame-pointer walk: the first frame is a probed function's first instruction */
	__u64 chunk;       /* the user address the CPU's unwind_chunks entry holds; 1: none */
	__u64 last_page;   /* the page the last read was in */
	/* The thread's last walk (struct walk_cache): */
	__u32 step_flags;  /* WALK_* of the step under way */
	__u32 search_lo;   /* the last walk's frames below it are below this walk's stack pointer */
	__u32 reused;      /* steps taken from the last walk */
	__u16 rows_cached, rows_searched, pages_read;  /* GS_UNWIND_STAT_*, summed at the walk's end */
	__u16 pad;
	__u64 step_bp_val; /* the saved rbp the step under way read (WALK_BP_READ) */
	__u64 stack_end;   /* the end of the mapping the walk's stack is in (thread_stack); 0: unknown */
	__u64 pending;     /* the start of the mapping whose pending table stopped the walk; 0: none */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);  /* UNWIND_SLOT_* */
	__type(key, __u32);
	__type(value, struct unwind_scratch);
} unwind_scratch_map SEC(".maps");

/* A thread's stacks mostly share their outer frames from one walk to the next: the same frames,
 * at the same stack addresses. Each walk keeps its frames here, per thread, and the next walk,
 * on reaching a frame whose registers (ip, sp, rbp) equal one of them, takes that frame's step
 * from here instead of from the tables when the words the step read (the return address, the
 * saved rbp) still hold what they held: the step's outcome depends on nothing else, so the stack
 * is the one the tables give. A word that changed sends the walk back to the tables. */
struct walk_frame {
	__u64 ip, sp, bp;
	__u64 bp_val;      /* WALK_BP_READ: the saved rbp the step read at bp */
	__u32 bp_known;
	__u32 flags;       /* WALK_*: how the step from this frame to the next went */
};
#define WALK_DEPTH 128         /* >= GS_MAX_NATIVE_DEPTH, a power of two */
#define WALK_STEPPED (1 << 0)  /* the step found the next frame: none for the last */
#define WALK_BP_READ (1 << 1)
#define WALK_FP_STEP (1 << 2)  /* along the frame pointer (code without a table) */
#define WALK_UNMAPPED (1 << 3) /* ... because no mapping of the table holds it */
#define WALK_OTHER_READ (1 << 4)  /* the step read a word not kept here: not taken from here */
#define WALK_SEARCH 8          /* log2(WALK_DEPTH) + 1 halvings */
#define WALK_PER_ITERATION 8

struct walk_cache {
	__u32 tgid, gen;   /* the process and its table (gs_unwind_proc.gen) the frames were walked with */
	__u32 cur;         /* frames[cur] holds the last walk; the next writes the other */
	__u32 nr[2];
	struct walk_frame frames[2][WALK_DEPTH];
};

/* One per thread and kind of walk: a CPU sample can interrupt a call's walk on its thread. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct walk_cache);
} walk_cache_call SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct walk_cache);
} walk_cache_sample SEC(".maps");

struct unwind_ctx {
	struct unwind_scratch *s;
	struct gs_unwind_proc *proc;
	struct unwind_chunk *k;
	struct walk_cache *wc;  /* NULL: none (no memory for one, or the fp walk) */
	__u32 old, old_nr;      /* the last walk: wc->frames[old], old_nr frames (0: none usable) */
	__u32 tgid, slot;
};

/* Rows found lately, by pc, per CPU and UNWIND_SLOT_*: a process's tables are tens of MiB (a
 * PyTorch process's ~90), so a row search reads cold memory: the mapping, the page index and a
 * few rows. Stacks keep coming back to the same call sites; the walk cache above covers only
 * the frames a thread's last stack shares with its new one. Direct-mapped. */
struct row_cache_entry {
	__u64 pc;
	__u32 tgid, gen;   /* the process and its tables' gs_unwind_proc.gen */
	struct gs_unwind_row row;
};
#define ROW_CACHE_BITS 12

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 << ROW_CACHE_BITS);  /* UNWIND_SLOT_* << ROW_CACHE_BITS | slot */
	__type(key, __u32);
	__type(value, struct row_cache_entry);
} unwind_row_cache SEC(".maps");

#define UNWIND_MAP_SEARCH 10   /* log2(GS_UNWIND_MAX_MAPPINGS) + 1 */
#define UNWIND_ROW_SEARCH 32   /* row indexes are 32-bit */
#ifndef UNWIND_INLINE_SEARCH
#define UNWIND_INLINE_SEARCH 3  /* halvings: a bucket of up to 7 rows (kIndexRowsPerBucket: ~4) */
#endif

/* Binary searches, one halving per bpf_loop iteration: the verifier checks a callback once,
 * where a plain loop made it follow every path through both searches (over a million
 * instructions). */
struct search {
	__u32 lo, hi;      /* the answer is the last element <= key, at lo - 1 */
	__u32 first;       /* rows: the table's first row */
	__u32 key32;
	__u64 key;
	struct gs_unwind_proc *proc;
};

static long search_mapping(__u32 i, struct search *q)
{
	if (q->lo >= q->hi)
		return 1;
	__u32 mid = (q->lo + q->hi) / 2;
	if (q->proc->maps[mid & (GS_UNWIND_MAX_MAPPINGS - 1)].start <= q->key)
		q->lo = mid + 1;
	else
		q->hi = mid;
	return 0;
}

static long search_row(__u32 i, struct search *q)
{
	if (q->lo >= q->hi)
		return 1;
	__u32 mid = q->lo + (q->hi - q->lo) / 2, idx = q->first + mid;
	struct gs_unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &idx);
	if (!r)
		return 1;
	if (r->pc <= q->key32)
		q->lo = mid + 1;
	else
		q->hi = mid;
	return 0;
}

/* rbp is read from where a frame saved it only when a frame needs its value (a CFA from rbp,
 * a frame-pointer step): most optimised code uses rbp as any other register and never does, and
 * a probe read is most of a frame's cost. */
#define BP_SAVED 2

/* Reads the user word at addr through the chunk cache; 0 or a probe read's error. */
static __always_inline long unwind_read(struct unwind_scratch *s, struct unwind_chunk *k, __u64 addr,
					__u64 *out)
{
	__u64 base = addr & ~(__u64)(UNWIND_CHUNK - 1), off = addr - base;
	if (off > UNWIND_CHUNK - sizeof(__u64))  /* straddles the chunk's end: unaligned */
		return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
	if (base != s->chunk) {
		/* A caller's frame lies in the same page or a few above; an address further off is
		 * most likely a frame pointer that is not one (code that uses rbp for data), where
		 * the walk ends soon: a word read costs less than a page's there. */
		bool near = base - s->last_page <= UNWIND_NEAR_PAGES * UNWIND_CHUNK;
		s->last_page = base;
		if (!near)
			return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
		/* A page is readable whole or not at all: a word of one that failed would fail too
		 * (and a failed read costs a fault here). */
		s->pages_read++;
		long err = bpf_probe_read_user(k->b, UNWIND_CHUNK, (void *)base);
		if (err) {
			s->chunk = 1;
			return err;
		}
		s->chunk = base;
	}
	__builtin_memcpy(out, &k->b[off], sizeof(*out));
	return 0;
}

/* Makes s->bp rbp's value; false when it is unknown or unreadable. */
static __always_inline bool unwind_bp(struct unwind_scratch *s, struct unwind_chunk *k)
{
	if (s->bp_known == BP_SAVED) {
		if (unwind_read(s, k, s->bp, &s->bp)) {
			s->bp_known = 0;
			return false;
		}
		s->bp_known = 1;
		s->step_flags |= WALK_BP_READ;
		s->step_bp_val = s->bp;
	}
	return s->bp_known == 1;
}

/* Stops the walk: `cause` says why, GS_LOST_NR that it ended where the stack ends. */
static __always_inline long unwind_stop(struct unwind_scratch *s, __u32 cause)
{
	s->stop = cause;
	return 1;
}

/* The mapping a thread's stack pointer is in, kept per thread: a "return address" inside it is
 * a stack address. Threads' stacks are mappings like libraries, often just below one, so no
 * fixed span above the stack pointer tells stack from code. */
struct stack_span {
	__u64 start, end;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct stack_span);
} thread_stacks SEC(".maps");

static long stack_vma(struct task_struct *task, struct vm_area_struct *vma, struct stack_span *span)
{
	span->start = BPF_CORE_READ(vma, vm_start);
	span->end = BPF_CORE_READ(vma, vm_end);
	return 0;
}

/* The end of the mapping holding sp (one lookup per thread while sp stays in it; the main
 * thread's grows down and is looked up again then); 0 if unknown. */
static __always_inline __u64 thread_stack_end(__u64 sp)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct stack_span *span = bpf_task_storage_get(&thread_stacks, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!span)
		return 0;
	if (sp >= span->start && sp < span->end)
		return span->end;
	struct stack_span found = {};
	/* Fails when the mm's lock is held (another thread maps memory): no check this walk. */
	if (bpf_find_vma(task, sp, stack_vma, &found, 0) || sp < found.start || sp >= found.end)
		return 0;
	*span = found;
	return found.end;
}

/* The caller's frame from a frame-pointer chain: code without a table. */
static __always_inline long unwind_fp_step(struct unwind_scratch *s, struct unwind_chunk *k)
{
	__u64 frame[2];
	/* A frame pointer below the stack pointer or unaligned is not one: stop before reading. */
	if (!unwind_bp(s, k) || !s->bp || s->bp + 16 <= s->sp || (s->bp & 7) ||
	    unwind_read(s, k, s->bp, &frame[0]) || unwind_read(s, k, s->bp + 8, &frame[1]))
		return unwind_stop(s, GS_LOST_UNWIND_READ);
	/* A "return address" on the stack itself is a stack address: code that keeps rbp pointing
	 * at something other than a frame record (libffi's ffi_call_unix64 does), not a caller. */
	if (frame[1] >= s->sp && frame[1] < s->stack_end)
		return unwind_stop(s, GS_LOST_UNWIND_READ);
	s->fp_steps++;
	s->step_flags |= WALK_FP_STEP;
	s->sp = s->bp + 16;
	s->bp = frame[0];
	s->ip = frame[1];
	return s->ip ? 0 : unwind_stop(s, GS_LOST_NR);
}

/* Records the frame in s->ip as the stack's next, in *i; false (the walk stopped) when the stack
 * has no room for it. */
static __always_inline bool unwind_push_frame(struct unwind_scratch *s, __u32 *i)
{
	*i = s->rec.nr;
	if (*i >= GS_MAX_NATIVE_DEPTH) {
		unwind_stop(s, GS_LOST_UNWIND_DEPTH);
		return false;
	}
	s->rec.ips[*i & 127] = s->ip;
	s->rec.nr = *i + 1;
	s->hash = (s->hash ^ s->ip) * 0x100000001b3ULL;
	return true;
}

/* Keeps frame i (its registers now, and how the step from frame i - 1 went) for the thread's
 * next walk, and takes the step from frame i from the last walk when that is safe: true if it
 * did (s holds the caller's registers), false to step with the tables. */
static __always_inline bool walk_cached_step(struct unwind_ctx *c, __u32 i)
{
	struct unwind_scratch *s = c->s;
	struct walk_cache *wc = c->wc;
	struct walk_frame *nf = wc->frames[(c->old ^ 1) & 1];
	if (i) {
		struct walk_frame *prev = &nf[(i - 1) & (WALK_DEPTH - 1)];
		prev->flags = s->step_flags & WALK_OTHER_READ ? 0 : s->step_flags | WALK_STEPPED;
		prev->bp_val = s->step_bp_val;
	}
	struct walk_frame *f = &nf[i & (WALK_DEPTH - 1)];
	f->ip = s->ip;
	f->sp = s->sp;
	f->bp = s->bp;
	f->bp_known = s->bp_known;
	f->flags = 0;
	s->step_flags = 0;

	/* The last walk's frame with this stack pointer: they are sorted by it. */
	__u32 nr = c->old_nr & (WALK_DEPTH - 1), lo = s->search_lo, hi = nr;
	struct walk_frame *of = wc->frames[c->old & 1];
	if (lo >= nr || s->sp > of[(nr - 1) & (WALK_DEPTH - 1)].sp)
		return false;
	/* After a step taken from here the next frame is the candidate: no search. */
	for (int h = 0; h < WALK_SEARCH && lo < hi && of[lo & (WALK_DEPTH - 1)].sp < s->sp; h++) {
		__u32 mid = (lo + hi) / 2;
		if (of[mid & (WALK_DEPTH - 1)].sp < s->sp)
			lo = mid + 1;
		else
			hi = mid;
	}
	s->search_lo = lo;
	if (lo + 1 >= nr)
		return false;  /* none, or the last walk's last frame: how it ended is not kept */
	struct walk_frame *o = &of[lo & (WALK_DEPTH - 1)], *next = &of[(lo + 1) & (WALK_DEPTH - 1)];
	/* The same registers; and the first frame's row is looked up by ip, the others' by ip - 1. */
	if (o->sp != s->sp || o->ip != s->ip || o->bp != s->bp || o->bp_known != s->bp_known ||
	    !(o->flags & WALK_STEPPED) || !i != !lo)
		return false;
	/* The words the step read: the saved rbp, the caller's frame pointer for a frame-pointer
	 * step, and the return address. */
	__u64 word;
	if ((o->flags & WALK_BP_READ) && (unwind_read(s, c->k, o->bp, &word) || word != o->bp_val))
		return false;
	if ((o->flags & WALK_FP_STEP) && (unwind_read(s, c->k, next->sp - 16, &word) || word != next->bp))
		return false;
	if (unwind_read(s, c->k, next->sp - 8, &word) || word != next->ip)
		return false;
	s->step_flags = o->flags & ~WALK_STEPPED;
	s->step_bp_val = o->bp_val;
	if (o->flags & WALK_FP_STEP)
		s->fp_steps++;
	if (o->flags & WALK_UNMAPPED)
		s->unmapped++;
	s->ip = next->ip;
	s->sp = next->sp;
	s->bp = next->bp;
	s->bp_known = next->bp_known;
	s->search_lo = lo + 1;
	s->reused++;
	return true;
}

/* Frames: record each one's ip, take its step from the thread's last walk where that holds,
 * else find its mapping and row and compute the caller's registers. */
static long unwind_frame(__u32 iteration, struct unwind_ctx *c)
{
	struct unwind_scratch *s = c->s;
	struct gs_unwind_proc *proc = c->proc;
	struct unwind_chunk *k = c->k;
	__u32 i;
	/* Steps taken from the last walk are cheap next to a bpf_loop iteration (an indirect
	 * call: ~10 ns in a uprobe on the dev VM), so an iteration takes up to WALK_PER_ITERATION
	 * of them; the frame after the last is stepped with the tables. */
	for (int n = 0;; n++) {
		if (!unwind_push_frame(s, &i))
			return 1;
		if (!c->wc || !walk_cached_step(c, i))
			break;
		if (n == WALK_PER_ITERATION - 1)
			return 0;
	}
	__u64 ip = s->ip;
	if (i == 0 && s->at_entry) {
		/* A probe at a function's first instruction: whatever its table says there, the return
		 * address is at rsp and rbp is the caller's. No table needed: the probed libraries'
		 * (libcuda's) are only compiled if a CPU sample or a call from inside them needs them. */
		if (unwind_read(s, k, s->sp, &s->ip))
			return unwind_stop(s, GS_LOST_UNWIND_READ);
		s->sp += 8;
		return s->ip ? 0 : unwind_stop(s, GS_LOST_NR);
	}
	/* A return address is after its call: the call's own rules are the ones before it. */
	__u64 pc = i ? ip - 1 : ip;
	struct gs_unwind_row found;
	__u32 rc_key = (c->slot & 1) << ROW_CACHE_BITS | (__u32)((pc * 0x9e3779b97f4a7c15ULL) >> (64 - ROW_CACHE_BITS));
	struct row_cache_entry *rc = bpf_map_lookup_elem(&unwind_row_cache, &rc_key);
	if (rc && rc->pc == pc && rc->tgid == c->tgid && rc->gen == proc->gen) {
		found = rc->row;
		s->rows_cached++;
		goto have_row;
	}

	__u32 nr = proc->nr < GS_UNWIND_MAX_MAPPINGS ? proc->nr : GS_UNWIND_MAX_MAPPINGS;
	__u32 mi = s->last_map & (GS_UNWIND_MAX_MAPPINGS - 1);
	struct gs_unwind_mapping *m = &proc->maps[mi];
	struct search q = {};
	if (mi >= nr || pc < m->start || pc >= m->end) {
		q.hi = nr;
		q.key = pc;
		q.proc = proc;
		bpf_loop(UNWIND_MAP_SEARCH, search_mapping, &q, 0);
		mi = (q.lo - 1) & (GS_UNWIND_MAX_MAPPINGS - 1);
		m = &proc->maps[mi];
		if (q.lo == 0 || pc >= m->end) {
			s->unmapped++;
			s->step_flags |= WALK_UNMAPPED;
			return unwind_fp_step(s, k);
		}
		s->last_map = mi;
	}
	if (!m->table_len) {
		if (m->flags & GS_UNWIND_MAP_PENDING) {
			/* The stack goes as a copy instead (call_user_stack, on_cpu_sample). */
			s->pending = m->start;
			return unwind_stop(s, GS_LOST_NR);
		}
		return unwind_fp_step(s, k);
	}

	__u64 rel = pc - m->pc_delta;
	if (rel > 0xffffffffULL)
		return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);
	q.lo = 0;
	q.hi = m->table_len;
	q.first = m->table_off;
	q.key32 = rel;
	if (m->index_len >= 2) {
		/* The page index (events.h: gs_unwind_mapping) gives the few rows to search. */
		__u64 b = rel >> (m->index_shift & 63);
		if (b >= m->index_len - 1) {
			q.lo = q.hi;  /* past the last row's bucket: the last row (a NONE) */
		} else {
			__u32 at = q.first + q.hi + (__u32)(b >> 1);
			__u32 *e = bpf_map_lookup_elem(&unwind_rows, &at);
			if (!e)
				return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);
			__u32 lo = e[b & 1], hi;
			if (b & 1) {
				at++;
				e = bpf_map_lookup_elem(&unwind_rows, &at);
				if (!e)
					return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);
				hi = e[0];
			} else {
				hi = e[1];
			}
			if (lo > hi || hi > q.hi)
				return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);  /* a corrupt index */
			q.lo = lo;
			q.hi = hi;
		}
	}
	/* A bucket's few rows are searched inline (a bpf_loop iteration costs a call); a bucket
	 * that still has rows to search after that goes on in bpf_loop. */
	for (int j = 0; j < UNWIND_INLINE_SEARCH && q.lo < q.hi; j++) {
		__u32 mid = q.lo + (q.hi - q.lo) / 2, at = q.first + mid;
		struct gs_unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &at);
		if (!r)
			return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);
		if (r->pc <= q.key32)
			q.lo = mid + 1;
		else
			q.hi = mid;
	}
	if (q.lo < q.hi)
		bpf_loop(UNWIND_ROW_SEARCH, search_row, &q, 0);
	if (q.lo == 0)
		return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);
	__u32 idx = q.first + q.lo - 1;
	struct gs_unwind_row *row = bpf_map_lookup_elem(&unwind_rows, &idx);
	if (!row)
		return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);
	found = *row;
	s->rows_searched++;
	if (rc) {
		rc->pc = pc;
		rc->tgid = c->tgid;
		rc->gen = proc->gen;
		rc->row = found;
	}

have_row:;
	__u8 cfa_rule = found.rules & 0xf, rbp_rule = found.rules >> 4;
	__s64 cfa_off = (__s64)found.cfa_off * 8, rbp_off = (__s64)found.rbp_off * 8;
	__u64 cfa;
	switch (cfa_rule) {
	case GS_CFA_RSP:
		cfa = s->sp + cfa_off;
		break;
	case GS_CFA_RBP:
		if (s->bp_known == BP_SAVED && !unwind_bp(s, k))
			return unwind_stop(s, GS_LOST_UNWIND_READ);
		if (!s->bp_known)
			return unwind_stop(s, GS_LOST_UNWIND_UNSUPPORTED);
		cfa = s->bp + cfa_off;
		break;
	case GS_CFA_PLT:
		cfa = s->sp + 8 + ((ip & 15) >= (__u64)found.cfa_off ? 8 : 0);
		break;
	case GS_CFA_DEREF_RBP:
		s->step_flags |= WALK_OTHER_READ;
		if (!unwind_bp(s, k) || unwind_read(s, k, s->bp + cfa_off, &cfa))
			return unwind_stop(s, GS_LOST_UNWIND_READ);
		break;
	case GS_CFA_OUTERMOST:
		return unwind_stop(s, GS_LOST_NR);
	case GS_CFA_NONE:
		return unwind_stop(s, GS_LOST_UNWIND_NO_ROW);
	default:
		return unwind_stop(s, GS_LOST_UNWIND_UNSUPPORTED);
	}
	if (cfa <= s->sp)
		return unwind_stop(s, GS_LOST_UNWIND_READ);  /* a stack only grows down: garbage */

	__u64 ra = 0, bp = s->bp;
	if (unwind_read(s, k, cfa - 8, &ra))
		return unwind_stop(s, GS_LOST_UNWIND_READ);
	if (rbp_rule == GS_RBP_AT_CFA) {
		bp = cfa + rbp_off;
		s->bp_known = BP_SAVED;
	} else if (rbp_rule == GS_RBP_AT_RBP) {
		if (!unwind_bp(s, k))
			return unwind_stop(s, GS_LOST_UNWIND_READ);
		bp = s->bp + rbp_off;
		s->bp_known = BP_SAVED;
	} else if (rbp_rule != GS_RBP_SAME) {
		s->bp_known = 0;
	}
	s->ip = ra;
	s->sp = cfa;
	s->bp = bp;
	return ra ? 0 : unwind_stop(s, GS_LOST_NR);
}

static __always_inline __u64 native_stack_id(struct unwind_scratch *s, __u32 tgid, __u32 flags, __u32 slot);

/* Readies this CPU's scratch and stack chunk of `slot` (UNWIND_SLOT_*) in c for a walk of the
 * user stack whose registers are `regs`; false if either map has no entry for them. */
static __always_inline bool unwind_start(struct unwind_ctx *c, struct pt_regs *regs, __u32 tgid, __u32 slot)
{
	__u32 chunk_key = bpf_get_smp_processor_id() * 2 + slot;
	struct unwind_scratch *s = bpf_map_lookup_elem(&unwind_scratch_map, &slot);
	struct unwind_chunk *k = bpf_map_lookup_elem(&unwind_chunks, &chunk_key);
	if (!s || !k)
		return false;
	s->ip = BPF_CORE_READ(regs, ip);
	s->sp = BPF_CORE_READ(regs, sp);
	s->bp = BPF_CORE_READ(regs, bp);
	s->bp_known = 1;
	s->stop = GS_LOST_UNWIND_DEPTH;
	s->fp_steps = 0;
	s->unmapped = 0;
	s->last_map = 0;
	s->at_entry = 0;
	s->chunk = 1;
	s->last_page = s->sp & ~(__u64)(UNWIND_CHUNK - 1);
	s->step_flags = 0;
	s->step_bp_val = 0;
	s->search_lo = 0;
	s->reused = 0;
	s->rows_cached = 0;
	s->rows_searched = 0;
	s->pages_read = 0;
	s->stack_end = thread_stack_end(s->sp);
	s->pending = 0;
	s->hash = 0xcbf29ce484222325ULL ^ tgid;
	s->rec.nr = 0;
	c->s = s;
	c->k = k;
	c->tgid = tgid;
	c->slot = slot;
	return true;
}

/* Walks the user stack whose registers are `regs` with the process's tables and returns its
 * id, the stack sent first if it is new. A walk cut short keeps what it found. 0 with *pending
 * set when the walk needs a table that is not there yet (none for the process yet, or one of
 * its files', which is asked for): the caller sends a copy of the stack instead; 0 otherwise
 * when there is no stack. at_entry: regs are at a probed function's first instruction. */
static __always_inline __u64 unwind_user_stack(struct pt_regs *regs, __u64 pid_tgid, __u32 slot, bool at_entry,
					       bool *pending)
{
	__u32 tgid = pid_tgid >> 32;
	struct gs_unwind_proc *proc = bpf_map_lookup_elem(&unwind_procs, &tgid);
	__u8 one = 1;
	if (!proc) {
		bpf_map_update_elem(&unwind_wanted, &tgid, &one, BPF_NOEXIST);
		*pending = true;
		return 0;
	}
	struct unwind_ctx c = {.proc = proc};
	if (!unwind_start(&c, regs, tgid, slot))
		return 0;
	struct unwind_scratch *s = c.s;
	s->at_entry = at_entry;
	struct task_struct *task = bpf_get_current_task_btf();
	struct walk_cache *wc = slot == UNWIND_SLOT_SAMPLE
		? bpf_task_storage_get(&walk_cache_sample, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE)
		: bpf_task_storage_get(&walk_cache_call, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (wc) {
		c.wc = wc;
		c.old = wc->cur & 1;
		if (wc->tgid == tgid && wc->gen == proc->gen)
			c.old_nr = wc->nr[c.old];
	}
	bpf_loop(GS_MAX_NATIVE_DEPTH + 1, unwind_frame, &c, 0);
	if (wc) {
		__u32 next = (c.old ^ 1) & 1;
		wc->nr[next] = s->rec.nr;
		wc->cur = next;
		wc->tgid = tgid;
		wc->gen = proc->gen;
	}
	if (s->pending) {
		struct gs_unwind_file_want want = {.tgid = tgid, .start = s->pending};
		bpf_map_update_elem(&unwind_files_wanted, &want, &one, BPF_NOEXIST);
		*pending = true;
		return 0;
	}
	if (!s->rec.nr)
		return 0;
	struct unwind_stat_counts *st = unwind_stat_counts();
	if (st) {
		st->n[GS_UNWIND_STAT_WALKS]++;
		st->n[GS_UNWIND_STAT_FRAMES] += s->rec.nr;
		st->n[GS_UNWIND_STAT_FRAMES_REUSED] += s->reused;
		st->n[GS_UNWIND_STAT_ROWS_CACHED] += s->rows_cached;
		st->n[GS_UNWIND_STAT_ROWS_SEARCHED] += s->rows_searched;
		st->n[GS_UNWIND_STAT_PAGES_READ] += s->pages_read;
	}
	if (s->fp_steps)
		count_lost(GS_LOST_UNWIND_NO_TABLE);
	if (s->unmapped)
		bpf_map_update_elem(&unwind_wanted, &tgid, &one, BPF_NOEXIST);
	__u32 flags = 0;
	if (s->stop == GS_LOST_NR)
		flags = GS_NATIVE_COMPLETE;
	else if (s->stop < GS_LOST_NR)
		count_lost(s->stop);
	return native_stack_id(s, tgid, flags, slot);
}

/* A walked stack's id, the stack sent first unless user space has it (its id hashes the
 * process, the frames and the flags in); 0 when it could not be sent. A CPU sample's stack is
 * sent every time, for its record alone (GS_NATIVE_ONCE): its leaf is wherever the thread was,
 * so nearly every one is new, and kept they would crowd out the calls' stacks here and fill
 * user space. */
static __always_inline __u64 native_stack_id(struct unwind_scratch *s, __u32 tgid, __u32 flags, __u32 slot)
{
	__u8 one = 1;
	bool once = slot == UNWIND_SLOT_SAMPLE;
	if (once)
		flags |= GS_NATIVE_ONCE;
	__u64 id = ((s->hash ^ flags) * 0x100000001b3ULL) | 1;  /* never 0 */
	if (!once && bpf_map_lookup_elem(&native_stacks_sent, &id))
		return id;
	s->rec.kind = GS_REC_NATIVE_STACK;
	s->rec.pid = tgid;
	s->rec.id = id;
	s->rec.flags = flags;
	s->rec.pad = 0;
	__u64 size = sizeof(s->rec) - sizeof(s->rec.ips) + (__u64)s->rec.nr * sizeof(__u64);
	if (size > sizeof(s->rec))
		size = sizeof(s->rec);
	/* No wake-up: the record naming the stack follows and decides (a wake-up per sample's
	 * stack cost the consumer more than the stacks themselves). */
	if (bpf_ringbuf_output(&events, &s->rec, size, BPF_RB_NO_WAKEUP)) {
		count_lost(GS_LOST_UNWIND_SEND);
		return 0;
	}
	if (!once)
		bpf_map_update_elem(&native_stacks_sent, &id, &one, BPF_ANY);
	return id;
}

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

static __always_inline void read_args(struct pt_regs *ctx, __u64 *args)
{
	/* x86-64 System V: rdi, rsi, rdx, rcx, r8, r9. */
	args[0] = ctx->di;
	args[1] = ctx->si;
	args[2] = ctx->dx;
	args[3] = ctx->cx;
	args[4] = ctx->r8;
	args[5] = ctx->r9;
	/* At a function's first instruction sp points at the return address; the 7th
	 * argument and on follow it. */
	bpf_probe_read_user(&args[GS_NUM_REG_ARGS], (GS_NUM_ARGS - GS_NUM_REG_ARGS) * sizeof(__u64),
			    (void *)(ctx->sp + 8));
}

/* A batch copy's entry data (GS_COOKIE_BATCH): (dsts, srcs, sizes, count, ...) in both APIs
 * and CUDA versions. sizes[] is read GS_DEREF_LEN bytes at a time into the second half of dst,
 * in a bpf_loop (a plain loop's paths were past the verifier's limit). */
struct batch_read {
	struct gs_batch_entry *b;
	__u64 *chunk;
	const __u64 *sizes;
	__u64 count;
};

static long batch_sizes_step(__u32 i, struct batch_read *c)
{
	struct gs_batch_entry *b = c->b;
	__u64 summed = b->summed;
	if (summed >= c->count)
		return 1;
	__u32 n = GS_DEREF_LEN / 8;
	if (c->count - summed < n)
		n = c->count - summed;
	if (bpf_probe_read_user(c->chunk, n * 8, c->sizes + summed)) {
		count_lost(GS_LOST_DEREF);
		return 1;
	}
	__u64 bytes = 0;
	for (__u32 j = 0; j < GS_DEREF_LEN / 8; j++)
		if (j < n)
			bytes += c->chunk[j];
	b->bytes += bytes;
	b->summed = summed + n;
	return 0;
}

static __noinline __u32 read_batch_sizes(const __u64 *args, __u8 *dst, __u32 *flags)
{
	struct gs_batch_entry *b = (struct gs_batch_entry *)dst;
	struct batch_read c = {.b = b, .chunk = (__u64 *)(dst + GS_DEREF_LEN), .sizes = (const __u64 *)args[2],
			       .count = args[3] < GS_BATCH_MAX_SIZES ? args[3] : GS_BATCH_MAX_SIZES};
	b->bytes = 0;
	b->summed = 0;
	bpf_loop(GS_BATCH_MAX_SIZES / (GS_DEREF_LEN / 8), batch_sizes_step, &c, 0);
	if (bpf_probe_read_user(&b->dst0, sizeof(b->dst0), (const void *)args[0]))
		b->dst0 = 0;
	if (bpf_probe_read_user(&b->src0, sizeof(b->src0), (const void *)args[1]))
		b->src0 = 0;
	*flags |= GS_CALL_DEREF_OK;
	return sizeof(*b);
}

/* A 3-D batch copy's entry data (GS_COOKIE_BATCH3D): (numOps, opList, ...). Each operation is
 * read into the second half of dst. */
struct batch3d_read {
	struct gs_batch3d_entry *b;
	__u8 *op;
	const __u8 *list;
	__u64 count;
};

static long batch3d_step(__u32 i, struct batch3d_read *c)
{
	struct gs_batch3d_entry *b = c->b;
	__u8 *op = c->op;
	if (i >= c->count)
		return 1;
	if (bpf_probe_read_user(op, GS_BATCH3D_OP_LEN, c->list + (__u64)i * GS_BATCH3D_OP_LEN)) {
		count_lost(GS_LOST_DEREF);
		return 1;
	}
	/* cudaMemcpy3DOperand / CUmemcpy3DOperand: its type, then its pointer or array at +8. */
	__u32 src_type = *(__u32 *)op, dst_type = *(__u32 *)(op + 40);
	__u64 src = *(__u64 *)(op + 8), dst = *(__u64 *)(op + 48);
	__u64 elems = *(__u64 *)(op + 80) * *(__u64 *)(op + 88) * *(__u64 *)(op + 96);
	if (i == 0) {
		b->src0_type = src_type;
		b->dst0_type = dst_type;
		b->src0 = src;
		b->dst0 = dst;
	}
	b->ops = i + 1;
	if (src_type != GS_MEMCPY_OPERAND_ARRAY && dst_type != GS_MEMCPY_OPERAND_ARRAY) {
		b->bytes += elems;
		return 0;
	}
	__u64 array = dst_type == GS_MEMCPY_OPERAND_ARRAY ? dst : src;
	if (!b->array[0] || b->array[0] == array) {
		b->array[0] = array;
		b->elems[0] += elems;
	} else if (!b->array[1] || b->array[1] == array) {
		b->array[1] = array;
		b->elems[1] += elems;
	} else {
		b->other_ops++;
	}
	return 0;
}

static __noinline __u32 read_batch3d_ops(const __u64 *args, __u8 *dst, __u32 *flags)
{
	struct gs_batch3d_entry *b = (struct gs_batch3d_entry *)dst;
	struct batch3d_read c = {.b = b, .op = dst + GS_DEREF_LEN, .list = (const __u8 *)args[1],
				 .count = args[0] < GS_BATCH_MAX_OPS ? args[0] : GS_BATCH_MAX_OPS};
	__builtin_memset(b, 0, sizeof(*b));
	bpf_loop(GS_BATCH_MAX_OPS, batch3d_step, &c, 0);
	*flags |= GS_CALL_DEREF_OK;
	return sizeof(*b);
}

/* Copy what an argument points at (a launch config, a copy descriptor, a kernel name) into dst,
 * which has room for `room` bytes (GS_DEREF_LEN in a record, GS_DEREF_LONG_LEN in a pending
 * call). Not inlined (nor the other rare paths of the call probes: send_later_lookup,
 * hold_later_lookup): code that most calls skip still filled the cache lines that the launch
 * probe runs through. */
static __noinline __u32 read_entry_deref(__u64 cookie, const __u64 *args, __u8 *dst, __u32 *flags, __u32 room)
{
	/* room is a constant at each call: the verifier drops this branch where it is too small. */
	if (room >= GS_DEREF_LONG_LEN) {
		if (GS_COOKIE_BATCH(cookie))
			return read_batch_sizes(args, dst, flags);
		if (GS_COOKIE_BATCH3D(cookie))
			return read_batch3d_ops(args, dst, flags);
	}
	__u32 arg = GS_COOKIE_ENTRY_ARG(cookie);
	if (!arg || arg > GS_NUM_ARGS)
		return 0;
	/* The mask only convinces the verifier; arg is already known to be in range. */
	const void *src = (const void *)args[(arg - 1) & 15];
	__u32 len = GS_COOKIE_ENTRY_LEN(cookie);
	if (len > room)
		len = room;
	if (len > GS_DEREF_LONG_LEN)
		len = GS_DEREF_LONG_LEN;
	long n;
	if (GS_COOKIE_ENTRY_STR(cookie))
		n = bpf_probe_read_user_str(dst, GS_DEREF_LEN, src);
	else
		n = bpf_probe_read_user(dst, len, src) == 0 ? len : -1;
	if (n < 0) {
		/* A name not paged in is read again by user space; only data is lost. */
		if (!GS_COOKIE_ENTRY_STR(cookie))
			count_lost(GS_LOST_DEREF);
		return 0;
	}
	*flags |= GS_CALL_DEREF_OK;
	return n;
}

/* ---- Python frames (see events.h) ---- */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);  /* tgid */
	__type(value, struct gs_py_process);
} python_procs SEC(".maps");

/* Each thread's PyThreadState, found once by walking the interpreter's thread list and
 * checked at every use (a thread state is freed when its thread ends). Task storage: no hash
 * lookup on the call path, and the kernel frees it with the thread. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);  /* PyThreadState address; 0: not known; PY_NO_TSTATE | list head: none */
} py_thread_states SEC(".maps");

/* A thread that has no thread state (a C++ worker launching in a Python process) is not looked
 * for again in the interpreter's thread list while the list's head is the one its search saw:
 * CPython puts every new thread state at the head, so none of them is this thread's. Searching
 * at every call made such a thread's launch probe 1,153 ns on the dev VM, against 775 with
 * --no-python. */
#define PY_NO_TSTATE (1ULL << 63)

/* Stacks and code objects user space has been sent: a stack costs a record once. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);    /* stack id: a hash of the process and its frames */
	__type(value, __u8);
} py_stacks_sent SEC(".maps");

struct py_code_key {
	__u32 tgid;
	__u32 pad;
	__u64 code;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct py_code_key);
	__type(value, __u8);
} py_codes_sent SEC(".maps");

/* Bytes of a frame read at once: every field walked lies within. A 3.10 frame object's f_lasti
 * lies further in than a 3.11+ interpreter frame's fields; a 3.11+ frame may end soon after. */
#define PY_FRAME_READ 80
#define PY_FRAME_READ_310 112
#define PY_CODE_READ 160   /* likewise for a code object */
/* Frames (3.11+) sit next to each other in the thread's data stack, a caller's below its
 * callee's, so the walk reads from the start of a frame's page to the frame's end at once and
 * finds the frames below it in that copy: one read per page of frames instead of one per
 * frame (a read costs ~100 ns in a uprobe, most of it fixed). */
#define PY_PAGE 4096
#define PY_CHUNK_MAX (PY_PAGE + PY_FRAME_READ_310)
#define PY_CHUNK_MASK 8191   /* > PY_CHUNK_MAX: indexes into chunk[] that the verifier can bound */
/* 3.12+ puts a shim frame on the C stack at each entry into the interpreter from C (a call of a
 * class instance, e.g. each nn.Module), between two data-stack frames. Read as the data stack's
 * frames, each shim would replace the data-stack page in chunk[] and its caller read that page
 * again: two page reads per entry. A frame on the thread's C stack (within PY_C_STACK_SPAN above
 * its stack pointer) is read on its own, into chunk[] past the page, which stays. An address
 * there that is not a shim is read the same way: right, only not batched. */
#define PY_C_STACK_SPAN (2ULL << 20)
#define PY_APART_AT (PY_CHUNK_MAX + 16)  /* where chunk[] holds a frame read on its own */

struct py_scratch {
	struct gs_py_stack_record rec;
	struct gs_py_offsets off;
	__u64 frame;       /* next frame to read */
	__u64 hash;
	__u64 tstate;      /* thread-list walk: the state looked at, then the one found */
	__u64 thread_key;  /* what the thread's PyThreadState holds at tstate_native_thread_id */
	__u64 owner;       /* pid_tgid of the walk using this scratch (see python_stack) */
	__u64 chunk_base;  /* user address of chunk[0]; chunk[] holds [chunk_base, chunk_end) */
	__u64 chunk_end;
	__u64 c_stack_lo;  /* the thread's user stack pointer (see PY_C_STACK_SPAN) */
	__u32 reads;       /* probe reads of frames in this walk */
	__u32 shims;       /* 3.12+'s shim frames in this walk */
	__u8 buf[256 + 8];  /* a code object read, indexed by offsets below 256 */
	__u8 chunk[PY_CHUNK_MASK + 1 + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);  /* UNWIND_SLOT_*: a CPU sample can interrupt a call's walk */
	__type(key, __u32);
	__type(value, struct py_scratch);
} py_scratch_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);  /* UNWIND_SLOT_* */
	__type(key, __u32);
	__type(value, struct gs_py_code_record);
} py_code_scratch SEC(".maps");

/* What the Python walk's bpf_loop callbacks work on: this program's slot of the scratch maps. */
struct py_walk {
	struct py_scratch *s;
	__u32 slot;
};

#define PY_THREADS_MAX 256


static __always_inline __u64 buf_u64(struct py_scratch *s, __u16 off)
{
	return *(__u64 *)(s->buf + (off & 255));
}

/* A word of the frame at chunk[at]: at + off < PY_CHUNK_MAX, as the frame lies in the chunk. */
static __always_inline __u64 chunk_u64(struct py_scratch *s, __u32 at, __u16 off)
{
	return *(__u64 *)(s->chunk + ((at + off) & PY_CHUNK_MASK));
}

#define PY_TSTATE_READ 256  /* bytes of a thread state read at once, into buf[] */

/* A word of the thread state read into buf[], or read on its own beyond what was read. */
static __always_inline __u64 tstate_u64(struct py_scratch *s, __u64 tstate, __u16 off)
{
	__u64 v = 0;
	if (off <= PY_TSTATE_READ - sizeof(v))
		return buf_u64(s, off);
	bpf_probe_read_user(&v, sizeof(v), (void *)(tstate + off));
	return v;
}

static long find_thread_state(__u32 i, void *ctx)
{
	struct py_scratch *s = ((struct py_walk *)ctx)->s;
	if (!s || !s->tstate)
		return 1;
	__u64 native_tid = 0, next = 0;
	bpf_probe_read_user(&native_tid, sizeof(native_tid), (void *)(s->tstate + s->off.tstate_native_thread_id));
	if (native_tid == s->thread_key)
		return 1;
	bpf_probe_read_user(&next, sizeof(next), (void *)(s->tstate + s->off.tstate_next));
	s->tstate = next;
	return 0;
}

static __always_inline long walk_py_frame_step(void *ctx)
{
	struct py_scratch *s = ((struct py_walk *)ctx)->s;
	if (!s || !s->frame)
		return 1;
	__u64 f = s->frame;
	__u32 frame_len = (s->off.flags & GS_PY_FRAME_PER_EVAL) ? PY_FRAME_READ_310 : PY_FRAME_READ;
	__u32 at;
	if (f >= s->chunk_base && f + frame_len <= s->chunk_end) {
		at = f - s->chunk_base;
	} else if (f - s->c_stack_lo < PY_C_STACK_SPAN) {
		s->reads++;
		if (bpf_probe_read_user(s->chunk + PY_APART_AT, frame_len, (void *)f)) {
			s->rec.flags |= GS_PY_STACK_TRUNCATED;
			return 1;
		}
		at = PY_APART_AT;
	} else {
		__u64 start = f & ~(__u64)(PY_PAGE - 1);
		/* Written so that the verifier sees the bound: at most PY_CHUNK_MAX. */
		__u32 len = (f & (PY_PAGE - 1)) + frame_len;
		s->reads++;
		if (bpf_probe_read_user(s->chunk, len, (void *)start)) {
			/* The page's start unreadable (it cannot be faulted in here): the frame alone. */
			start = f;
			len = frame_len;
			if (bpf_probe_read_user(s->chunk, frame_len, (void *)f)) {
				s->rec.flags |= GS_PY_STACK_TRUNCATED;
				return 1;
			}
		}
		s->chunk_base = start;
		s->chunk_end = start + len;
		at = f - start;
	}
	__u64 code = chunk_u64(s, at, s->off.frame_code);
	__u64 instr = chunk_u64(s, at, s->off.frame_instr);
	s->frame = chunk_u64(s, at, s->off.frame_previous);
	__u32 n = s->rec.depth;
	if (s->off.frame_owner != GS_PY_NONE &&
	    s->chunk[(at + s->off.frame_owner) & PY_CHUNK_MASK] == s->off.owner_cstack) {
		/* The shim frame C pushed: the frame above it is where that C call entered. */
		if (n > 0)
			s->rec.frames[(n - 1) & (GS_MAX_PY_FRAMES - 1)].code |= GS_PY_FRAME_ENTRY;
		s->shims++;
		return 0;
	}
	if (n >= GS_MAX_PY_FRAMES) {
		s->rec.flags |= GS_PY_STACK_TRUNCATED;
		return 1;
	}
	if (s->off.frame_is_entry != GS_PY_NONE && s->chunk[(at + s->off.frame_is_entry) & PY_CHUNK_MASK])
		code |= GS_PY_FRAME_ENTRY;
	if (!s->frame || (s->off.flags & GS_PY_FRAME_PER_EVAL))
		code |= GS_PY_FRAME_ENTRY;  /* the outermost frame was entered from C */
	s->rec.frames[n & (GS_MAX_PY_FRAMES - 1)].code = code;
	s->rec.frames[n & (GS_MAX_PY_FRAMES - 1)].instr = instr;
	s->rec.depth = n + 1;
	s->hash = (s->hash ^ code) * 0x100000001b3ULL;
	s->hash = (s->hash ^ instr) * 0x100000001b3ULL;
	return 0;
}

/* Frames that lie in the page already read cost less than a bpf_loop iteration: several per
 * iteration. */
#define PY_FRAMES_PER_ITERATION 4

static long walk_py_frame(__u32 iteration, void *ctx)
{
	for (int n = 0; n < PY_FRAMES_PER_ITERATION; n++)
		if (walk_py_frame_step(ctx))
			return 1;
	return 0;
}

/* A Python str as UTF-8 when it is compact ASCII (names and paths nearly always are);
 * false otherwise, and user space reads it from the process. */
static __always_inline bool read_py_ascii(char *dst, __u32 size, __u64 obj, const struct gs_py_offsets *off)
{
	__u8 state = 0;
	/* PyASCIIObject.state: kind in bits 2..4, compact bit 5, ascii bit 6. */
	if (!obj || bpf_probe_read_user(&state, 1, (void *)(obj + 32)))
		return false;
	if ((state & 0x60) != 0x60)
		return false;
	return bpf_probe_read_user_str(dst, size, (void *)(obj + off->unicode_ascii_data)) > 0;
}

static long send_py_code(__u32 i, void *ctx)
{
	struct py_scratch *s = ((struct py_walk *)ctx)->s;
	if (!s || i >= s->rec.depth)
		return 1;
	__u64 code = s->rec.frames[i & (GS_MAX_PY_FRAMES - 1)].code & ~GS_PY_FRAME_ENTRY;
	struct py_code_key key = {.tgid = s->rec.pid, .code = code};
	if (bpf_map_lookup_elem(&py_codes_sent, &key))
		return 0;
	__u32 slot = ((struct py_walk *)ctx)->slot;
	struct gs_py_code_record *r = bpf_map_lookup_elem(&py_code_scratch, &slot);
	if (!r)
		return 1;
	r->kind = GS_REC_PY_CODE;
	r->flags = 0;
	r->pid = s->rec.pid;
	r->code = code;
	r->firstlineno = 0;
	r->linetable_len = 0;
	if (bpf_probe_read_user(s->buf, PY_CODE_READ, (void *)code))
		return 0;
	r->firstlineno = *(__s32 *)(s->buf + (s->off.code_firstlineno & 255));
	if (read_py_ascii(r->qualname, sizeof(r->qualname), buf_u64(s, s->off.code_qualname), &s->off))
		r->flags |= GS_PY_CODE_NAME_OK;
	if (read_py_ascii(r->filename, sizeof(r->filename), buf_u64(s, s->off.code_filename), &s->off))
		r->flags |= GS_PY_CODE_FILE_OK;
	__u64 table = buf_u64(s, s->off.code_linetable);
	__u64 len = 0;
	/* PyBytesObject: ob_size (the length) is the third word. */
	if (table && !bpf_probe_read_user(&len, sizeof(len), (void *)(table + 16))) {
		__u32 n = len > GS_PY_LINETABLE_LEN ? GS_PY_LINETABLE_LEN : len;
		r->linetable_len = len;
		if (n == len && !bpf_probe_read_user(r->linetable, n, (void *)(table + s->off.bytes_data)))
			r->flags |= GS_PY_CODE_LINETABLE_OK;
	}
	if (bpf_ringbuf_output(&events, r, sizeof(*r), BPF_RB_NO_WAKEUP)) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 1;
	}
	__u8 one = 1;
	bpf_map_update_elem(&py_codes_sent, &key, &one, BPF_ANY);
	return 0;
}

/* The current thread's Python stack id, its frames and new code objects sent first; 0 when
 * the process runs no known interpreter or the thread runs no Python. */
static __always_inline __u64 python_stack(__u64 pid_tgid, struct pt_regs *regs, __u32 slot)
{
	if (!python_stacks)
		return 0;
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	struct gs_py_process *proc = bpf_map_lookup_elem(&python_procs, &tgid);
	if (!proc)
		return 0;
	struct py_scratch *s = bpf_map_lookup_elem(&py_scratch_map, &slot);
	if (!s)
		return 0;
	struct py_walk walk = {.s = s, .slot = slot};
	/* A uprobe program can be preempted, and another thread's call probe on this CPU then
	 * takes the same scratch: a walk that finds another owner at its end was written over. */
	s->owner = pid_tgid;
	s->off = proc->off;
	s->thread_key = tid;
	if (s->off.flags & GS_PY_THREAD_ID_IS_PTHREAD)
		s->thread_key = BPF_CORE_READ(bpf_get_current_task_btf(), thread.fsbase);

	/* The thread's state: remembered, and checked to still be this thread's. Its first
	 * PY_TSTATE_READ bytes are read at once: they hold the fields used below. */
	__u64 tstate = 0;
	__u64 *known = bpf_task_storage_get(&py_thread_states, bpf_get_current_task_btf(), 0,
					    BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (known && *known && !(*known & PY_NO_TSTATE)) {
		tstate = *known;
		if (bpf_probe_read_user(s->buf, PY_TSTATE_READ, (void *)tstate) ||
		    tstate_u64(s, tstate, s->off.tstate_native_thread_id) != s->thread_key)
			tstate = 0;
	}
	if (!tstate) {
		__u64 interp = 0;
		s->tstate = 0;
		if (bpf_probe_read_user(&interp, sizeof(interp), (void *)(proc->runtime + s->off.runtime_interp_head)) ||
		    !interp ||
		    bpf_probe_read_user(&s->tstate, sizeof(s->tstate), (void *)(interp + s->off.interp_threads_head)))
			return 0;
		const __u64 head = s->tstate;
		if (known && *known == (PY_NO_TSTATE | head))
			return 0;  /* no thread state made since this thread's last search */
		bpf_loop(PY_THREADS_MAX, find_thread_state, &walk, 0);
		tstate = s->tstate;
		if (!tstate) {
			/* A thread that has not run Python (yet). */
			if (known)
				*known = PY_NO_TSTATE | head;
			return 0;
		}
		if (known)
			*known = tstate;
		if (bpf_probe_read_user(s->buf, PY_TSTATE_READ, (void *)tstate))
			return 0;
	}

	__u64 frame = 0;
	if (s->off.tstate_cframe != GS_PY_NONE) {
		__u64 cframe = tstate_u64(s, tstate, s->off.tstate_cframe);
		if (!cframe || bpf_probe_read_user(&frame, sizeof(frame), (void *)(cframe + s->off.current_frame)))
			return 0;
	} else {
		frame = tstate_u64(s, tstate, s->off.current_frame);
	}
	if (!frame)
		return 0;

	s->frame = frame;
	s->chunk_base = 0;
	s->chunk_end = 0;
	s->c_stack_lo = BPF_CORE_READ(regs, sp);
	s->reads = 0;
	s->shims = 0;
	s->hash = 0xcbf29ce484222325ULL ^ tgid;
	s->rec.kind = GS_REC_PY_STACK;
	s->rec.depth = 0;
	s->rec.pid = tgid;
	s->rec.flags = 0;
	s->rec.pad = 0;
	bpf_loop(GS_MAX_PY_FRAMES + 16, walk_py_frame, &walk, 0);
	if (s->owner != pid_tgid) {
		count_lost(GS_LOST_PY_STACK);
		return 0;
	}
	if (!s->rec.depth)
		return 0;
	struct unwind_stat_counts *st = unwind_stat_counts();
	if (st) {
		st->n[GS_UNWIND_STAT_PY_WALKS]++;
		st->n[GS_UNWIND_STAT_PY_FRAMES] += s->rec.depth + s->shims;
		st->n[GS_UNWIND_STAT_PY_READS] += s->reads;
	}
	__u64 id = s->hash | 1;  /* never 0 */
	s->rec.id = id;
	if (bpf_map_lookup_elem(&py_stacks_sent, &id))
		return id;

	/* New: its code objects first, then the stack, each once. */
	bpf_loop(GS_MAX_PY_FRAMES, send_py_code, &walk, 0);
	if (s->owner != pid_tgid) {
		count_lost(GS_LOST_PY_STACK);
		return 0;
	}
	__u64 size = sizeof(s->rec) - sizeof(s->rec.frames) + (__u64)s->rec.depth * sizeof(struct gs_py_frame);
	if (size > sizeof(s->rec))
		size = sizeof(s->rec);
	if (bpf_ringbuf_output(&events, &s->rec, size, BPF_RB_NO_WAKEUP)) {
		count_lost(GS_LOST_PY_STACK);
		return 0;
	}
	__u8 one = 1;
	bpf_map_update_elem(&py_stacks_sent, &id, &one, BPF_ANY);
	return id;
}

static __always_inline __u32 copy_user_state(struct gs_user_regs *dst, __u8 *stack, struct pt_regs *regs,
					     __u16 *holes);

/* The copies' rate limit, as a generic cell rate algorithm: the time at which the bucket of
 * GS_STACK_COPIES_BURST copies would be empty again at GS_STACK_COPIES_PER_S. */
volatile __u64 copies_tat;
#define COPY_INTERVAL_NS (1000000000ULL / GS_STACK_COPIES_PER_S)

/* A walk that needs a table not made yet sends a copy of the stack instead: true unless that
 * would pass GS_STACK_COPIES_PER_S or the ring holds more than half its size unread (copies are
 * 16 KiB), then frame pointers this time. A burst of new stacks at start (a process that launches
 * at once, before the walker is loaded) must not flood user space, which unwinds each copy. */
static __always_inline bool copy_instead_of_table(void)
{
	__u64 now = bpf_ktime_get_ns(), tat = copies_tat;
	bool over = tat > now + GS_STACK_COPIES_BURST * COPY_INTERVAL_NS;
	if (!over)  /* racy across CPUs: a few more may pass than the limit says */
		copies_tat = (tat > now ? tat : now) + COPY_INTERVAL_NS;
	if (over ||
	    bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > bpf_ringbuf_query(&events, BPF_RB_RING_SIZE) / 2) {
		count_lost(GS_LOST_UNWIND_COPY_LIMIT);
		return false;
	}
	struct unwind_stat_counts *st = unwind_stat_counts();
	if (st)
		st->n[GS_UNWIND_STAT_COPIES]++;
	return true;
}

/* The call's user stack: the id of a stack walked here (from the unwind tables with
 * --call-stacks eh-frame, else along frame pointers), or 0 and a copy of the stack sent now,
 * ahead of the call's record (flagged in *flags): with --call-stacks dwarf, and with eh-frame
 * while a table the walk needs is not there yet. */
static __always_inline __u64 call_user_stack(struct pt_regs *ctx, __u64 cookie, __u64 ts_ns, __u32 *flags)
{
	if (!capture_stacks || GS_COOKIE_NO_STACK(cookie))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	bool copy = call_stack_copy;
	if (call_unwind_tables) {
		__u64 native = unwind_user_stack(ctx, id, UNWIND_SLOT_CALL, true, &copy);
		if (!copy)
			return native;
		copy = copy_instead_of_table();
	} else if (call_tables_later && !walker_failed) {
		copy = copy_instead_of_table();  /* the walker is being loaded */
	}
	if (copy) {
		struct gs_stack_copy_record *c = bpf_ringbuf_reserve(&events, sizeof(*c), 0);
		if (!c) {
			count_lost(GS_LOST_RINGBUF_FULL);
			return 0;
		}
		c->kind = GS_REC_STACK_COPY;
		c->pid = id >> 32;
		c->tid = (__u32)id;
		c->ts_ns = ts_ns;
		c->stack_len = copy_user_state(&c->regs, c->data, ctx, &c->holes);
		bpf_ringbuf_submit(c, BPF_RB_NO_WAKEUP);
		*flags |= GS_CALL_STACK_COPIED;
		return 0;
	}
	return fp_user_stack(ctx, id, UNWIND_SLOT_CALL, true);
}

/* A call's stacks, both walks and the budget's charge. A global function, verified and compiled
 * apart: inlined, the walks' code sat in the middle of every call probe, which cost calls whose
 * stack is not taken (most, under --stack-every or --stack-budget) time as well. */
struct call_stacks {
	__u64 native;
	__u64 py;
	__u32 flags;
	__u32 pad;
};

__noinline int take_call_stacks(struct pt_regs *ctx, __u64 cookie, __u64 ts_ns, struct call_stacks *out)
{
	if (!out)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 flags = 0;
	out->native = call_user_stack(ctx, cookie, ts_ns, &flags);
	out->py = !capture_stacks || GS_COOKIE_NO_STACK(cookie) ? 0 : python_stack(id, ctx, UNWIND_SLOT_CALL);
	out->flags = flags;
	charge_stack_walks(cookie, id >> 32, ts_ns);
	return 0;
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

/* The record of a lookup whose out-pointer was left for later (struct thread_marks), as its
 * return probe would have sent it, less the result and duration. */
static __noinline void send_later_lookup(struct thread_marks *m, __u64 id)
{
	struct gs_call_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		m->later_ts = 0;
		return;
	}
	call_record_head(r, id, m->later_cookie, GS_CALL_OUT_LATER, m->later_ts, 0);
	r->ret = 0;
	__builtin_memset(r->args, 0, sizeof(r->args));
	r->args[0] = m->later_args[0];
	r->args[1] = m->later_args[1];
	r->deref_len = 0;
	r->stack_weight = 0;
	r->py_stack = 0;
	r->native_stack = 0;
	r->out_value = 0;
	if (bpf_probe_read_user(&r->out_value, sizeof(r->out_value), (void *)m->later_out) == 0)
		r->flags |= GS_CALL_OUT_OK;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	m->later_ts = 0;
	bpf_ringbuf_submit(r, submit_flags());
}

/* A lookup whose out-pointer is read later (GS_COOKIE_OUT_LATER): kept in the thread's marks
 * until its next launch or lookup. 1 when kept, 0 when it is to be sent now. */
static __noinline int hold_later_lookup(struct pt_regs *ctx, __u64 id, __u64 cookie, __u64 ts_ns)
{
	struct thread_marks *m = bpf_task_storage_get(&thread_marks, bpf_get_current_task_btf(), 0,
						      BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!m)
		return 0;
	if (m->later_ts)  /* a lookup with no launch after it: its handle is written by now */
		send_later_lookup(m, id);
	__u32 out_idx = GS_COOKIE_RET_ARG(cookie) - 1;
	if (out_idx >= 2)  /* lookups' out-pointers come first or second */
		return 0;
	m->later_args[0] = ctx->di;
	m->later_args[1] = ctx->si;
	/* From the copies: a choice between ctx fields compiles to a ctx pointer moved by a
	 * variable offset, which the verifier refuses. */
	m->later_out = m->later_args[out_idx & 1];
	m->later_cookie = cookie;
	m->later_ts = ts_ns;
	return 1;
}

/* Launches: entry only, so that a launch costs one trap. */
SEC("uprobe")
int call_entry_emit(struct pt_regs *ctx)
{
	if (call_tables_later)
		bpf_tail_call(ctx, &upgrade_calls, UPGRADE_EMIT);
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 ts_ns = bpf_ktime_get_ns();
	__u32 flags = 0;
	bool skip_stack = false;
	if (GS_COOKIE_RT_LAUNCH(cookie)) {
		struct thread_marks *m = bpf_task_storage_get(&thread_marks, bpf_get_current_task_btf(), 0,
							      BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (m)
			m->rt_launch_ns = ts_ns;
	} else if (GS_COOKIE_DRV_LAUNCH(cookie)) {
		struct thread_marks *m = bpf_task_storage_get(&thread_marks, bpf_get_current_task_btf(), 0, 0);
		if (m) {
			if (m->later_ts)
				send_later_lookup(m, id);
			if (m->rt_launch_ns && ts_ns - m->rt_launch_ns < RUNTIME_TO_DRIVER_NS) {
				skip_stack = true;
				flags |= GS_CALL_UNDER_RUNTIME;
				m->rt_launch_ns = 0;
			}
		}
	} else if (GS_COOKIE_OUT_LATER(cookie) && hold_later_lookup(ctx, id, cookie, ts_ns)) {
		return 0;
	}
	__u32 stack_weight = 0;
	if (!skip_stack)
		skip_stack = stack_sampled_out(cookie, id >> 32, &flags, &stack_weight);
	/* Before the call's record is reserved, so that a stack copy or a new Python stack comes
	 * ahead of it. */
	struct call_stacks st = {};
	if (!skip_stack && capture_stacks) {
		take_call_stacks(ctx, cookie, ts_ns, &st);
		flags |= st.flags;
	}

	struct gs_call_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	call_record_head(r, id, cookie, flags, ts_ns, 0);
	r->ret = 0;
	r->out_value = 0;
	read_args(ctx, r->args);
	r->deref_len = GS_COOKIE_ENTRY_ARG(cookie) ? read_entry_deref(cookie, r->args, r->deref, &r->flags, GS_DEREF_LEN) : 0;
	r->stack_weight = stack_weight;
	r->py_stack = st.py;
	r->native_stack = st.native;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}

/* Calls whose result matters: keep the entry until the return probe fires. */
SEC("uprobe")
int call_entry(struct pt_regs *ctx)
{
	if (call_tables_later)
		bpf_tail_call(ctx, &upgrade_calls, UPGRADE_ENTRY);
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tag = pending_tag(cookie);
	__u64 now = bpf_ktime_get_ns();
	struct pending_thread *t = bpf_task_storage_get(&pending, bpf_get_current_task_btf(), 0,
							 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t) {
		count_lost(GS_LOST_PENDING_FULL);
		return 0;
	}
	int slot = pending_slot(t, tag);
	if (slot >= 0) {
		/* The same function entered again before it returned: a wrapper of the driver's name
		 * calling the driver's own (XLA's and Triton's shims call libcuda's, and both are
		 * probed). The outer call is the one recorded; without this its return found no
		 * entry. An older entry is stale (its return was missed): this call takes its slot. */
		struct pending_call *outer = &t->call[slot & (PENDING_SLOTS - 1)];
		if (now - outer->ts_ns < GS_NESTED_CALL_NS) {
			outer->nested++;
			return 0;
		}
	} else if ((slot = pending_slot(t, 0)) < 0) {
		/* No free slot: the one pending longest gives way (most likely a missed return). */
		__u64 oldest_ts = ~0ULL;
		for (int i = 0; i < PENDING_SLOTS; i++)
			if (t->call[i].ts_ns < oldest_ts) {
				oldest_ts = t->call[i].ts_ns;
				slot = i;
			}
		count_lost(GS_LOST_PENDING_FULL);
	}

	slot &= PENDING_SLOTS - 1;
	struct pending_call *p = &t->call[slot];
	t->tag[slot] = tag;
	p->ts_ns = now;
	p->flags = 0;
	p->nested = 0;
	read_args(ctx, p->args);
	p->deref_len = read_entry_deref(cookie, p->args, p->deref, &p->flags, GS_DEREF_LONG_LEN);
	/* A call made inside a runtime call: a driver call (cudaMemsetAsync's cuMemsetD8Async) or
	 * another runtime function the runtime calls through its exported name
	 * (cudaMemcpyArrayToArray's cudaMemcpyFromArray and cudaMemcpyToArray). Its stack would be
	 * the runtime call's and a few of the runtime's frames; user space nests it under that call
	 * and gives it its stack. A runtime entry older than GS_NESTED_CALL_NS is one whose return
	 * was missed, as may be one of a function whose probes are being removed (retiring_funcs):
	 * neither makes this call an inner one. Launches do not come here (call_entry_emit). */
	bool in_runtime = false;
	for (int i = 0; i < PENDING_SLOTS; i++) {
		if (i == slot || !(t->tag[i] & PENDING_RUNTIME) || now - t->call[i].ts_ns >= GS_NESTED_CALL_NS)
			continue;
		__u32 fn = (t->tag[i] & ~PENDING_RUNTIME) - 1;
		if (fn < 256 && (retiring_funcs[(fn >> 6) & 3] & (1ULL << (fn & 63))))
			continue;
		in_runtime = true;
	}
	if (in_runtime)
		p->flags |= GS_CALL_UNDER_RUNTIME;
	p->stack_weight = 0;
	if (in_runtime || !capture_stacks || stack_sampled_out(cookie, id >> 32, &p->flags, &p->stack_weight)) {
		p->native_stack = 0;
		p->py_stack = 0;
		return 0;
	}
	struct call_stacks st = {};
	take_call_stacks(ctx, cookie, now, &st);
	p->native_stack = st.native;
	p->py_stack = st.py;
	p->flags |= st.flags;
	return 0;
}

SEC("uretprobe")
int call_return(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct pending_thread *t = bpf_task_storage_get(&pending, bpf_get_current_task_btf(), 0, 0);
	int slot = t ? pending_slot(t, pending_tag(cookie)) : -1;
	if (!t || slot < 0) {
		__u32 fn = GS_COOKIE_FUNC(cookie);
		if (!(retiring_funcs[(fn >> 6) & 3] & (1ULL << (fn & 63))))
			count_lost(GS_LOST_RETURN_ORPHAN);
		return 0;
	}
	slot &= PENDING_SLOTS - 1;
	struct pending_call *p = &t->call[slot];
	if (p->nested) {  /* an inner call of the same function returned */
		p->nested--;
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();

	struct gs_call_record *r;
	if (p->deref_len > GS_DEREF_LEN) {  /* a 3-D copy's descriptor: a longer record */
		struct gs_call_record_long *l = bpf_ringbuf_reserve(&events, sizeof(*l), 0);
		/* By words: both are 8-byte aligned, which a memcpy through the slot's variable
		 * offset does not know (it copied byte by byte). */
		const __u64 *from = (const __u64 *)(p->deref + GS_DEREF_LEN);
		__u64 *to = l ? (__u64 *)l->deref_more : 0;
		if (to)
			for (int i = 0; i < (GS_DEREF_LONG_LEN - GS_DEREF_LEN) / 8; i++)
				to[i] = from[i];
		r = (struct gs_call_record *)l;
	} else {
		r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	}
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		t->tag[slot] = 0;
		return 0;
	}
	call_record_head(r, id, cookie, p->flags | GS_CALL_HAS_RETURN, p->ts_ns, now - p->ts_ns);
	r->ret = ctx->ax;
	r->stack_weight = p->stack_weight;
	r->py_stack = p->py_stack;
	r->native_stack = p->native_stack;
	r->deref_len = p->deref_len;
	__builtin_memcpy(r->args, p->args, sizeof(r->args));
	__builtin_memcpy(r->deref, p->deref, sizeof(r->deref));
	r->out_value = 0;
	__u32 out_idx = GS_COOKIE_RET_ARG(cookie) - 1;
	if (out_idx < GS_NUM_REG_ARGS) {
		if (bpf_probe_read_user(&r->out_value, sizeof(r->out_value), (void *)p->args[out_idx & 7]) == 0)
			r->flags |= GS_CALL_OUT_OK;
		/* A second out-pointer after it, a size (GS_COOKIE_OUT_SIZE): as the entry data. */
		if (GS_COOKIE_OUT_SIZE(cookie) && out_idx + 1 < GS_NUM_REG_ARGS &&
		    bpf_probe_read_user(r->deref, sizeof(__u64), (void *)p->args[(out_idx + 1) & 7]) == 0) {
			r->deref_len = sizeof(__u64);
			r->flags |= GS_CALL_DEREF_OK;
		}
	}
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	t->tag[slot] = 0;
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}

/* ---- following targets ---- */

SEC("tracepoint/sched/sched_process_fork")
int on_fork(struct trace_event_raw_sched_process_fork *ctx)
{
	__u32 parent = bpf_get_current_pid_tgid() >> 32;
	__u32 child = BPF_CORE_READ(ctx, child_pid);
	if (python_stacks) {
		/* A forked interpreter has its parent's memory layout: same _PyRuntime. */
		struct gs_py_process *py = bpf_map_lookup_elem(&python_procs, &parent);
		if (py) {
			bpf_map_update_elem(&python_procs, &child, py, BPF_ANY);
			/* User space names the child's frames with its parent's interpreter. */
			struct gs_proc_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
			if (r) {
				r->kind = GS_REC_FORK;
				r->pad = 0;
				r->pid = child;
				r->ppid = parent;
				r->exit_code = 0;
				r->ts_ns = bpf_ktime_get_ns();
				bpf_get_current_comm(r->comm, sizeof(r->comm));
				bpf_ringbuf_submit(r, 0);
			} else {
				count_lost(GS_LOST_RINGBUF_FULL);
			}
		}
	}
	if (!filter_targets || !bpf_map_lookup_elem(&targets, &parent))
		return 0;
	__u8 one = 1;
	if (bpf_map_update_elem(&targets, &child, &one, BPF_ANY))
		count_lost(GS_LOST_TARGETS_FULL);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int on_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (python_stacks && tid == tgid)
		bpf_map_delete_elem(&python_procs, &tgid);
	if ((call_unwind_tables || sample_unwind_tables) && tid == tgid)
		bpf_map_delete_elem(&unwind_procs, &tgid);
	if (!is_target(tgid))
		return 0;
	if (tid != tgid) {
		if (filter_targets)
			bpf_map_delete_elem(&targets, &tid);
		return 0;
	}
	/* Before its pid can be reused (user space removes it from `targets` when it reads the exit).
	 * Should user space give the slot to another target in between, that one is found in the
	 * hash: a slot is only ever emptied wrongly, never filled. */
	if (target_slots[tgid & (GS_TARGET_SLOTS - 1)] == tgid)
		target_slots[tgid & (GS_TARGET_SLOTS - 1)] = 0;
	struct gs_proc_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	r->kind = GS_REC_EXIT;
	r->pid = tgid;
	r->ppid = 0;
	r->exit_code = BPF_CORE_READ(task, exit_code);
	r->ts_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	bpf_ringbuf_submit(r, 0);
	return 0;
}

static __always_inline void fill_sample(struct gs_sample_record *r, __u64 id, void *ctx, __u64 py_stack, __u64 ts_ns)
{
	r->py_stack = py_stack;
	r->native_stack = 0;
	r->kind = GS_REC_SAMPLE;
	r->cpu = bpf_get_smp_processor_id();
	r->pid = id >> 32;
	r->tid = (__u32)id;
	r->ts_ns = ts_ns;
	/* A sample taken in user mode has no kernel stack: EFAULT, not a loss. */
	r->kstack_id = get_stackid(ctx, 0);
	if (r->kstack_id < 0 && r->kstack_id != -EFAULT)
		count_lost(GS_LOST_STACK);
	bpf_get_current_comm(r->comm, sizeof(r->comm));
}

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

/* CPU profile: a perf cpu-clock event per CPU runs this at the sampling rate; only target
 * threads are recorded. Idle (pid 0) and other processes cost one lookup. */
SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (tgid == 0 || !is_target(tgid))
		return 0;
	if (sample_only_targets && !bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	/* The user-mode registers, also when the sample interrupted a system call. */
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	__u64 py_stack = python_stack(id, regs, UNWIND_SLOT_SAMPLE);
	/* The user stack first: a new one is sent ahead of the sample. */
	__u64 ts_ns = bpf_ktime_get_ns();
	__u64 native = 0;
	bool copy = sample_stack_copy;
	if (sample_unwind_tables) {
		native = unwind_user_stack(regs, id, UNWIND_SLOT_SAMPLE, false, &copy);
		if (copy)
			copy = copy_instead_of_table();
	}
	if (copy) {
		struct gs_sample_stack_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
		if (!r) {
			count_lost(GS_LOST_RINGBUF_FULL);
			return 0;
		}
		fill_sample(&r->s, id, ctx, py_stack, ts_ns);
		r->stack_len = copy_user_state(&r->regs, r->data, regs, &r->holes);
		r->pad = 0;
		bpf_ringbuf_submit(r, submit_flags());
		return 0;
	}
	if (!native)
		native = fp_user_stack(regs, id, UNWIND_SLOT_SAMPLE, false);
	struct gs_sample_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	fill_sample(r, id, ctx, py_stack, ts_ns);
	r->native_stack = native;
	bpf_ringbuf_submit(r, submit_flags());
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int on_exec(void *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	/* A new program: user space says whether it is an interpreter again. */
	if (python_stacks)
		bpf_map_delete_elem(&python_procs, &tgid);
	/* Its mappings are gone: until user space gives it tables again, frame pointers. */
	if (call_unwind_tables || sample_unwind_tables)
		bpf_map_delete_elem(&unwind_procs, &tgid);
	if (!is_target(tgid))
		return 0;
	struct gs_proc_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count_lost(GS_LOST_RINGBUF_FULL);
		return 0;
	}
	r->kind = GS_REC_EXEC;
	r->pid = tgid;
	r->ppid = 0;
	r->exit_code = 0;
	r->ts_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	/* User space looks at the new program at once (see the recorder's record handler). */
	bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	return 0;
}

/* ---- catching CUDA libraries before their first call ----
 * A uprobe on a file applies to every process that maps it afterwards; the window is a
 * library that nothing has attached to yet. The dynamic loader opens a library, maps it
 * and closes the descriptor before running any of its code. At that close we stop the
 * process; user space attaches to the file, snapshots the mappings, and continues it. */

/* What a path names, found in one pass: a file named like a CUDA library, or any shared
 * object ("x.so", "x.so.1.2"), which may carry a statically linked CUDA runtime. */
struct path_scan {
	const char *path;
	long len;
	bool cuda_name;
	bool shared_object;
};

static __always_inline char at(const char *p, __u32 i)
{
	return p[i & (GS_PATH_LEN - 1)];
}

static __always_inline bool has_prefix(const char *s, __u32 off, const char *prefix, __u32 n)
{
	for (__u32 i = 0; i < n; i++)
		if (at(s, off + i) != prefix[i])
			return false;
	return true;
}

/* bpf_loop's callback is verified once, whatever the path: a plain loop here made the
 * verifier walk every length and character branch (over a million instructions). */
static long scan_char(__u32 i, struct path_scan *ps)
{
	if (i >= ps->len)
		return 1;
	const char *p = ps->path;
	if ((i == 0 || at(p, i - 1) == '/') && i + 10 < GS_PATH_LEN &&
	    (has_prefix(p, i, "libcudart", 9) || has_prefix(p, i, "libcuda.so", 10)))
		ps->cuda_name = true;
	if (at(p, i) == '.' && at(p, i + 1) == 's' && at(p, i + 2) == 'o' &&
	    (at(p, i + 3) == 0 || at(p, i + 3) == '.'))
		ps->shared_object = true;
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_openat")
int on_openat_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	/* Another gpuscope (a recording beside the agent) opens CUDA libraries to read their
	 * symbols: that is no load, and it must not be stopped. */
	char comm[9];
	bpf_get_current_comm(comm, sizeof(comm));
	if (comm[0] == 'g' && comm[1] == 'p' && comm[2] == 'u' && comm[3] == 's' && comm[4] == 'c' && comm[5] == 'o' &&
	    comm[6] == 'p' && comm[7] == 'e')
		return 0;
	__u32 tid = (__u32)id;
	__u64 path = ctx->args[1];
	bpf_map_update_elem(&openat_args, &tid, &path, BPF_ANY);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int on_openat_exit(struct trace_event_raw_sys_exit *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	__u64 *path = bpf_map_lookup_elem(&openat_args, &tid);
	if (!path)
		return 0;
	__u64 user_path = *path;
	bpf_map_delete_elem(&openat_args, &tid);
	if (ctx->ret < 0)
		return 0;

	__u32 zero = 0;
	struct lib_open *lo = bpf_map_lookup_elem(&path_scratch, &zero);
	if (!lo)
		return 0;
	long len = bpf_probe_read_user_str(lo->path, sizeof(lo->path), (void *)user_path);
	if (len <= 0)
		return 0;
	struct path_scan ps = {.path = lo->path, .len = len};
	bpf_loop(GS_PATH_LEN - 4, scan_char, &ps, 0);
	if (!ps.cuda_name && !ps.shared_object)
		return 0;
	lo->cuda_name = ps.cuda_name;
	__u64 key = (id & 0xffffffff00000000ULL) | (__u32)ctx->ret;
	bpf_map_update_elem(&lib_fds, &key, lo, BPF_ANY);
	return 0;
}

/* Processes stopped here and not continued yet by user space, which deletes each as it sends
 * SIGCONT. A guardian process holds this map too (attach/stop_guardian.h): if gpuscope dies
 * holding a process (kill -9, a crash, the OOM killer), the guardian continues every one listed. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} stopped_held SEC(".maps");

/* Set by user space once the guardian is running: until then (or without one) nothing is stopped. */
volatile bool stops_guarded;

SEC("tracepoint/syscalls/sys_enter_close")
int on_close(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 key = (id & 0xffffffff00000000ULL) | (__u32)ctx->args[0];
	struct lib_open *lo = bpf_map_lookup_elem(&lib_fds, &key);
	if (!lo)
		return 0;
	/* Which file is it? A shared object checked once is never stopped for again. */
	__u32 fd = (__u32)ctx->args[0];
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct file **fds = BPF_CORE_READ(task, files, fdt, fd);
	struct file *file = NULL;
	bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]);
	struct gs_file_key fk = {};
	if (file) {
		fk.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
		fk.ino = BPF_CORE_READ(file, f_inode, i_ino);
	}
	if (!lo->cuda_name && (!file || bpf_map_lookup_elem(&checked_files, &fk))) {
		bpf_map_delete_elem(&lib_fds, &key);
		return 0;
	}
	struct gs_libload_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (r) {
		r->kind = GS_REC_LIBLOAD;
		r->cuda_name = lo->cuda_name;
		r->stopped = lo->cuda_name || stop_for_shared_objects;
		r->pid = id >> 32;
		r->tid = (__u32)id;
		r->fd = (__s32)fd;
		r->dev = fk.dev;
		r->ino = fk.ino;
		r->ts_ns = bpf_ktime_get_ns();
		__builtin_memcpy(r->path, lo->path, sizeof(r->path));
		/* Stop first: the signal is delivered when close returns, before the loader
		 * can run the library's code. User space continues the process. Only a process the
		 * guardian knows of is stopped: none is left stopped if gpuscope dies. */
		__u32 tgid = id >> 32;
		__u8 held = 1;
		if (r->stopped && (!stops_guarded || bpf_map_update_elem(&stopped_held, &tgid, &held, BPF_ANY)))
			r->stopped = 0;
		if (r->stopped)
			bpf_send_signal(SIGSTOP);
		bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	} else {
		count_lost(GS_LOST_RINGBUF_FULL);
	}
	bpf_map_delete_elem(&lib_fds, &key);
	return 0;
}

/* The agent's calibration: a probe that does nothing, on a function of the agent's own, so
 * that what one hit costs on this machine (the trap, the kernel's uprobe path) is measured
 * apart from what the programs above do. */
SEC("uprobe")
int calibration_hit(struct pt_regs *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
