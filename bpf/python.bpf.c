// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. */

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
	struct gs_py_frame *f = &s->rec.frames[i & (GS_MAX_PY_FRAMES - 1)];
	__u64 code = f->code & ~GS_PY_FRAME_ENTRY;
	if (code & ~GS_PY_CODE_ADDRESS_MASK)
		return 0;
	/* A code object freed (a module's, once it has run) and another made at its address would
	 * keep the first one's names: the frame carries a tag of the object's own fields, and a
	 * code object is one address and tag. Read at every frame of a new stack only: a stack
	 * already sent is known by its frames' addresses and instructions, so the same stack made
	 * again of new code objects at the old ones' addresses (generated code run again from one
	 * call site) keeps the first one's names. */
	if (bpf_probe_read_user(s->buf, PY_CODE_READ, (void *)code))
		return 0;
	__u64 tag = gs_py_code_tag(buf_u64(s, s->off.code_qualname), buf_u64(s, s->off.code_filename),
				   buf_u64(s, s->off.code_linetable),
				   *(__u32 *)(s->buf + (s->off.code_firstlineno & 255)));
	code |= tag << GS_PY_CODE_TAG_SHIFT;
	f->code = code | (f->code & GS_PY_FRAME_ENTRY);
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
	r->firstlineno = *(__s32 *)(s->buf + (s->off.code_firstlineno & 255));
	r->linetable_len = 0;
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
