// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. */

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
