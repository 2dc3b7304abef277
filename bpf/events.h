/* Wire format between the BPF programs (gpuscope.bpf.c and its parts) and user space.
 * This header is the one place where the layout of every ring-buffer record is defined;
 * both sides include it. Change it only together with src/decode. */
#ifndef GPUSCOPE_BPF_EVENTS_H
#define GPUSCOPE_BPF_EVENTS_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define GS_COMM_LEN 16
#define GS_PATH_LEN 256
/* Registers rdi..r9 followed by the first words above the return address: enough for
 * every probed signature (cuLaunchKernel passes its 9th..11th arguments on the stack). */
#define GS_NUM_ARGS 10
#define GS_NUM_REG_ARGS 6
#define GS_DEREF_LEN 128
/* Entry data of a call with a return probe may run to this (3-D copy descriptors: CUDA_MEMCPY3D
 * is 200 bytes): past GS_DEREF_LEN it comes in a gs_call_record_long, so every other record keeps
 * its size (launches, the hot path, are not made longer for them). */
#define GS_DEREF_LONG_LEN 256
#define GS_MAX_STACK_DEPTH 64

/* Stack ids, as records carry them: bpf_get_stackid's id in one of two stack maps, `stacks`
 * (generation 0) or `stacks_alt` (1), with the generation in bit 30 (ids are below the maps'
 * sizes, far below 2^30; negative values are errnos, kept as they are). A stack map's entries
 * are never freed by the kernel, and the agent sees new stacks for as long as it runs: user
 * space switches captures to the other map and, once no record can name the old map's ids,
 * empties it (src/record/pipeline.cpp, recycle_stacks). A record's ts_ns is taken before its
 * stacks are captured: by it, user space knows an id captured before its map was emptied. */
#define GS_STACK_GEN_BIT (1 << 30)
#define GS_STACK_ID_MASK (GS_STACK_GEN_BIT - 1)

enum gs_record_kind {
	GS_REC_CALL = 1,     /* one CUDA API call */
	GS_REC_LIBLOAD = 2,  /* a target is mapping a library that may need probes; it is stopped */
	GS_REC_EXEC = 3,     /* a target called execve */
	GS_REC_EXIT = 4,     /* a target process (thread group) exited */
	GS_REC_FORK = 5,     /* a target created a child process */
	GS_REC_SAMPLE = 6,   /* a CPU-clock sample of a target thread */
	GS_REC_STACK_COPY = 7, /* a call's user registers and stack copy, just before its call record */
	GS_REC_PY_STACK = 8, /* a Python stack not sent before, ahead of the first record naming it */
	GS_REC_PY_CODE = 9,  /* a Python code object not sent before: its names and line table */
	/* 10: once a user stack its stack map could not take; user stacks are walked in BPF now */
	GS_REC_NATIVE_STACK = 11, /* a user stack walked in BPF (frame pointers or .eh_frame tables),
	                           * sent once per process ahead of the first record naming it */
	GS_REC_THREAD_TIME = 12,  /* how a target thread spent a window of time (host_events.h) */
	GS_REC_FUNCTION_NAME = 13, /* a kernel function's name, as a process's launch hooks told it:
	                            * made by gpuscope from the launch rings, never by BPF */
	GS_REC_VERBS = 14,   /* an RDMA verbs call: control path or data path (verbs_events.h) */
	GS_REC_HOST_ALLOC = 15, /* a large host mapping made, moved or unmade (host_alloc_events.h) */
};

/* The BPF cookie of each uprobe, set by user space at attach time:
 *   bits  0..15  function id (src/decode/functions.h)
 *   bits 16..19  argument index + 1 to dereference at entry (0: none)
 *   bit  20      that dereference is a NUL-terminated string
 *   bits 24..31  bytes to copy at entry (<= GS_DEREF_LEN; a call with a return probe may ask for
 *                more: its record is then a gs_call_record_long)
 *   bit  21      capture no user stack (registrations and lookups: start-up noise)
 *   bit  22      a runtime launch: the driver launch it makes follows on the same thread
 *   bit  23      a driver launch: skips its stack when a runtime launch just came first
 *   bits 32..35  argument index + 1 of an out-pointer read (8 bytes) at return (0: none)
 *   bit  36      a runtime API function (the driver's calls made inside one skip their stack)
 *   bit  37      a high-rate call (launches, copies, memsets): its stack is one that
 *                --stack-every samples
 *   bit  38      entry only, its out-pointer (bits 32..35) read at the thread's next launch or
 *                lookup (struct thread_marks in common.bpf.h)
 *   bit  39      a batch copy (dsts, srcs, sizes, count, ...): its entry data is a
 *                gs_batch_entry, not a copy of an argument's pointee (bits 16..31 unused)
 *   bit  40      a 3-D batch copy (numOps, opList, ...): its entry data is a gs_batch3d_entry
 *   bit  41      the argument after the out-pointer (bits 32..35) is a second one, a size: its
 *                8 bytes are read at return too, as the call's entry data (deref_len 8; a module
 *                global's lookup: its address and size)
 *   bit  42      a launch whose stack the in-process hooks chose (gpuscope_launch_stack): its
 *                stack is always walked, and the walk charged to --stack-budget like bit 37's
 */
#define GS_COOKIE_FUNC(c) ((__u32)((c) & 0xffff))
#define GS_COOKIE_ENTRY_ARG(c) ((__u32)(((c) >> 16) & 0xf))
#define GS_COOKIE_ENTRY_STR(c) ((__u32)(((c) >> 20) & 0x1))
#define GS_COOKIE_NO_STACK(c) ((__u32)(((c) >> 21) & 0x1))
#define GS_COOKIE_RT_LAUNCH(c) ((__u32)(((c) >> 22) & 0x1))
#define GS_COOKIE_DRV_LAUNCH(c) ((__u32)(((c) >> 23) & 0x1))
#define GS_COOKIE_ENTRY_LEN(c) ((__u32)(((c) >> 24) & 0xff))
#define GS_COOKIE_RET_ARG(c) ((__u32)(((c) >> 32) & 0xf))
#define GS_COOKIE_RUNTIME(c) ((__u32)(((c) >> 36) & 0x1))
#define GS_COOKIE_SAMPLED_STACK(c) ((__u32)(((c) >> 37) & 0x1))
#define GS_COOKIE_OUT_LATER(c) ((__u32)(((c) >> 38) & 0x1))
#define GS_COOKIE_BATCH(c) ((__u32)(((c) >> 39) & 0x1))
#define GS_COOKIE_BATCH3D(c) ((__u32)(((c) >> 40) & 0x1))
#define GS_COOKIE_OUT_SIZE(c) ((__u32)(((c) >> 41) & 0x1))
#define GS_COOKIE_CHOSEN_STACK(c) ((__u32)(((c) >> 42) & 0x1))

enum gs_call_flags {
	GS_CALL_HAS_RETURN = 1 << 0,  /* ret and duration are valid */
	GS_CALL_DEREF_OK = 1 << 1,    /* deref[] holds entry data */
	GS_CALL_OUT_OK = 1 << 2,      /* out_value holds the out-pointer's value at return */
	/* a driver launch right after a runtime launch on its thread, or a call (driver or runtime)
	 * made inside a pending runtime call: no stack of its own (user space nests it under that
	 * call and gives it its stack) */
	GS_CALL_UNDER_RUNTIME = 1 << 3,
	GS_CALL_STACK_COPIED = 1 << 4,  /* the user stack came ahead, as a GS_REC_STACK_COPY with
	                                 * this tid and ts_ns */
	/* --stack-every N or --stack-budget: a launch, copy or memset whose stack was taken, standing
	 * for N calls (stack_weight) ... */
	GS_CALL_STACK_SAMPLED = 1 << 5,
	/* ... and one whose stack was left out (taken for 1 call in N, at random) */
	GS_CALL_STACK_SAMPLED_OUT = 1 << 6,
	/* an entry-only lookup sent at the thread's next launch or lookup, out_value read then
	 * (GS_COOKIE_OUT_LATER): no return value, and a handle not checked by one */
	GS_CALL_OUT_LATER = 1 << 7,
};

struct gs_call_record {
	__u16 kind;          /* GS_REC_CALL */
	__u16 func;
	__u32 flags;
	__u64 ts_ns;         /* CLOCK_MONOTONIC (bpf_ktime_get_ns) at entry */
	__u64 duration_ns;   /* entry to return; 0 without a return probe */
	__u32 pid;           /* thread group id */
	__u32 tid;
	__s64 ret;           /* the function's return value (rax) */
	__u32 deref_len;
	__u32 stack_weight;  /* GS_CALL_STACK_SAMPLED: the N of one in N the stack was taken for */
	__u64 py_stack;      /* id of the thread's Python stack (a GS_REC_PY_STACK), 0: none */
	__u64 native_stack;  /* id of its user stack (a GS_REC_NATIVE_STACK), 0: none */
	__u64 out_value;
	__u64 args[GS_NUM_ARGS];
	__u8 deref[GS_DEREF_LEN];
	char comm[GS_COMM_LEN];
};

/* A call whose entry data is longer than GS_DEREF_LEN (deref_len says how long): its first
 * GS_DEREF_LEN bytes in r.deref, the rest here. Told apart from a gs_call_record by its size. */
struct gs_call_record_long {
	struct gs_call_record r;
	__u8 deref_more[GS_DEREF_LONG_LEN - GS_DEREF_LEN];
};

/* The entry data of a batch copy (GS_COOKIE_BATCH): its sizes[] summed at entry, up to
 * GS_BATCH_MAX_SIZES of them, and its first copy's destination and source (dsts[0], srcs[0]). */
#define GS_BATCH_MAX_SIZES 4096
struct gs_batch_entry {
	__u64 bytes;   /* the sum of sizes[0 .. summed) */
	__u64 summed;  /* sizes read: count, or fewer (GS_BATCH_MAX_SIZES, or a read that failed) */
	__u64 dst0;
	__u64 src0;
};

/* The entry data of a 3-D batch copy (GS_COOKIE_BATCH3D), from its opList[] (cudaMemcpy3DBatchOp,
 * CUDA_MEMCPY3D_BATCH_OP: GS_BATCH3D_OP_LEN bytes each), up to GS_BATCH_MAX_OPS of them. An
 * operation's extent is in elements: bytes for pointer-to-pointer ones, else in elements of its
 * CUDA array (the destination's if both are), whose size user space knows from its creation. */
#define GS_BATCH_MAX_OPS 1024
#define GS_BATCH3D_OP_LEN 112
#define GS_MEMCPY_OPERAND_ARRAY 2  /* cudaMemcpyOperandTypeArray, CU_MEMCPY_OPERAND_TYPE_ARRAY */
struct gs_batch3d_entry {
	__u64 ops;          /* operations read: numOps, or fewer (GS_BATCH_MAX_OPS, a failed read) */
	__u64 bytes;        /* of pointer-to-pointer operations */
	__u64 array[2];     /* the first two arrays met */
	__u64 elems[2];     /* elements copied to or from each */
	__u64 other_ops;    /* operations with a third array: not counted */
	__u32 src0_type;    /* the first operation's operands (type: 1 pointer, 2 array) */
	__u32 dst0_type;
	__u64 src0;
	__u64 dst0;
};

/* The stops of one process (key: tgid): made by the BPF side (stops_made), answered with SIGCONT
 * by user space (stops_answered). The start time tells a process from a later one given its pid. */
struct gs_stop_count {
	__u64 start_ns;      /* the process's start (task->start_time of its leader) */
	__u32 count;
	__u32 pad;
};

struct gs_libload_record {
	__u16 kind;          /* GS_REC_LIBLOAD */
	__u8 cuda_name;      /* 1: named like a CUDA library; 0: a shared object that may hold a static runtime */
	__u8 stopped;        /* 1: the process was stopped and waits for user space to continue it */
	__u32 pid;
	__u32 tid;
	__s32 fd;
	__u64 ts_ns;
	__u64 dev;           /* the file's device (kernel encoding: major << 20 | minor) and inode */
	__u64 ino;
	struct gs_stop_count stop; /* when stopped: which of the process's stops this is */
	char path[GS_PATH_LEN];
};

/* A file user space has looked at (key of the checked_files map). */
struct gs_file_key {
	__u64 dev;
	__u64 ino;
};

struct gs_proc_record {
	__u16 kind;          /* GS_REC_EXEC, GS_REC_EXIT or GS_REC_FORK */
	__u16 pad;
	__u32 pid;
	__u32 ppid;          /* fork: the parent; exec/exit: 0 */
	__s32 exit_code;
	__u64 ts_ns;
	char comm[GS_COMM_LEN];
};

/* A CPU profile sample: the thread on a CPU when its cpu-clock event fired, with its user
 * stack (native_stack, or a copy: gs_sample_stack_record) and its kernel stack (a stack id, see
 * GS_STACK_GEN_BIT; negative: none, e.g. a thread in user mode has no kernel stack). */
struct gs_sample_record {
	__u16 kind;          /* GS_REC_SAMPLE */
	__u16 cpu;
	__u32 pid;
	__u32 tid;
	__s32 kstack_id;
	__u64 ts_ns;
	__u64 py_stack;      /* as in gs_call_record */
	__u64 native_stack;  /* as in gs_call_record */
	char comm[GS_COMM_LEN];
};

/* With --unwind dwarf, a sample also carries the thread's user registers and a copy of the
 * top of its user stack, which user space unwinds from the binaries' .eh_frame: code built
 * without frame pointers (libtorch, most of a distribution) cannot be walked otherwise. */
#define GS_STACK_COPY 16384
/* A copy's pieces, pages: one that could not be read at the probe is a hole user space fills (below). */
#define GS_STACK_COPY_CHUNK 4096
/* Copies sent in place of walks that need a table not made yet (on all CPUs): at most this many
 * a second, after a first burst of GS_STACK_COPIES_BURST (a program's first calls come at once,
 * before the tables they need are made): what user space unwinds with a few percent of a core,
 * and a sixteenth of the default ring buffer a second. */
#define GS_STACK_COPIES_PER_S 2000
#define GS_STACK_COPIES_BURST 2048
#define GS_MAX_UNWIND_DEPTH 127  /* frames kept from a stack unwound in user space */

struct gs_user_regs {
	__u64 ip, sp, bp, bx, r12, r13, r14, r15;
};

struct gs_sample_stack_record {
	struct gs_sample_record s;  /* s.kind = GS_REC_SAMPLE; told apart by the record's size */
	struct gs_user_regs regs;
	__u32 stack_len;            /* bytes of data[] copied from regs.sp upwards */
	/* Bit i: piece i of data[] could not be read at the probe (a page of the stack not mapped
	 * then: one never touched) and is not in data[]. Piece 0 is the part of sp's page above sp,
	 * piece i the i-th GS_STACK_COPY_CHUNK after it (pages). */
	__u16 holes;
	__u16 pad;
	__u8 data[GS_STACK_COPY];
};

/* --call-stacks dwarf: a CUDA call's stack, sent at its entry, before the call's record. */
struct gs_stack_copy_record {
	__u16 kind;          /* GS_REC_STACK_COPY */
	__u16 holes;         /* as in gs_sample_stack_record */
	__u32 pid;
	__u32 tid;
	__u32 stack_len;
	__u64 ts_ns;         /* the call's entry time: its record has the same */
	struct gs_user_regs regs;
	__u8 data[GS_STACK_COPY];
};

/* ---- Python ----
 * For a process running CPython, user space finds the interpreter (_PyRuntime) and gives the
 * BPF side its address and the structure offsets of that interpreter version (data from
 * src/discover/python.cpp; tools/python_offsets.py finds them in a live interpreter). At a
 * CUDA call or sample, the BPF side finds the thread's PyThreadState, walks its interpreter
 * frames, and sends each distinct stack once, and each code object once, so that the record
 * names every Python frame even after the process is gone. */
#define GS_PY_NONE 0xffff        /* an offset that this version does not have */
#define GS_MAX_PY_FRAMES 128
#define GS_PY_NAME_LEN 128
#define GS_PY_FILE_LEN 256
#define GS_PY_LINETABLE_LEN 2048

struct gs_py_offsets {
	__u16 runtime_interp_head;      /* _PyRuntimeState.interpreters.head */
	__u16 interp_threads_head;      /* PyInterpreterState.threads.head */
	__u16 tstate_next;              /* PyThreadState.next */
	__u16 tstate_native_thread_id;  /* PyThreadState.native_thread_id (the kernel tid) */
	__u16 tstate_cframe;            /* PyThreadState.cframe (3.11, 3.12); GS_PY_NONE: the frame
	                                 * pointer is in the thread state itself (3.13+) */
	__u16 current_frame;            /* _PyCFrame.current_frame, or PyThreadState.current_frame */
	__u16 frame_code;               /* _PyInterpreterFrame.f_code / f_executable */
	__u16 frame_previous;
	__u16 frame_instr;              /* prev_instr (3.11, 3.12) / instr_ptr (3.13+) */
	__u16 frame_is_entry;           /* bool is_entry (3.11), or GS_PY_NONE */
	__u16 frame_owner;              /* char owner (3.12+), or GS_PY_NONE */
	__u16 owner_cstack;             /* owner value of a shim frame that C pushed (3.12+) */
	__u16 code_firstlineno;
	__u16 code_filename;
	__u16 code_qualname;            /* co_qualname; co_name before 3.11 */
	__u16 code_linetable;
	__u16 unicode_ascii_data;       /* characters of a compact ASCII str */
	__u16 bytes_data;               /* PyBytesObject.ob_sval */
	__u16 flags;                    /* gs_py_layout_flags */
};

enum gs_py_layout_flags {
	/* tstate_native_thread_id is PyThreadState.thread_id, the thread's pthread_t (its TLS base,
	 * fsbase, on x86-64 glibc), where the kernel tid is not kept (3.10). */
	GS_PY_THREAD_ID_IS_PTHREAD = 1 << 0,
	/* Every frame is entered by a C call of its own (3.10: a PyFrameObject per
	 * _PyEval_EvalFrameDefault); frame_instr is f_lasti, an int, not a pointer. */
	GS_PY_FRAME_PER_EVAL = 1 << 1,
};

struct gs_py_process {
	__u64 runtime;                  /* address of _PyRuntime in the process */
	struct gs_py_offsets off;
};

/* A frame as sent: its code object, with bit 0 set when this frame is the outermost one of a
 * C call into the interpreter (user space pairs those with _PyEval_EvalFrameDefault frames of
 * the native stack), and the instruction it is at. */
#define GS_PY_FRAME_ENTRY 1ULL
/* Bits 48..63 of a frame's code tell apart code objects that one address held in turn (a
 * tag of the object's fields, python.bpf.c's send_py_code); the address is the rest. */
#define GS_PY_CODE_TAG_SHIFT 48
#define GS_PY_CODE_ADDRESS_MASK ((1ULL << GS_PY_CODE_TAG_SHIFT) - 1 - GS_PY_FRAME_ENTRY)
/* The tag, from the object's qualname, filename and line table pointers and its first line:
 * BPF computes it as it reads the object, user space as it reads one from the process, and a
 * name read later is kept only where the tags agree. */
static inline __u16 gs_py_code_tag(__u64 qualname, __u64 filename, __u64 linetable, __u32 firstlineno)
{
	__u64 tag = qualname ^ (filename << 7) ^ (linetable << 13) ^ ((__u64)firstlineno * 0x9e3779b97f4a7c15ULL);
	tag ^= tag >> 32;
	tag ^= tag >> 16;
	return (__u16)tag;
}
struct gs_py_frame {
	__u64 code;
	__u64 instr;
};

enum gs_py_stack_flags {
	GS_PY_STACK_TRUNCATED = 1 << 0,  /* deeper than GS_MAX_PY_FRAMES, or a frame was unreadable */
};

struct gs_py_stack_record {
	__u16 kind;          /* GS_REC_PY_STACK */
	__u16 depth;         /* frames[] used, innermost first; the record is cut after them */
	__u32 pid;
	__u64 id;            /* what call and sample records carry in py_stack */
	__u32 flags;
	__u32 pad;
	struct gs_py_frame frames[GS_MAX_PY_FRAMES];
};

enum gs_py_code_flags {
	GS_PY_CODE_NAME_OK = 1 << 0,       /* qualname[] holds the compact ASCII name */
	GS_PY_CODE_FILE_OK = 1 << 1,       /* filename[] likewise */
	GS_PY_CODE_LINETABLE_OK = 1 << 2,  /* linetable[] holds the whole table */
};

struct gs_py_code_record {
	__u16 kind;          /* GS_REC_PY_CODE */
	__u16 flags;
	__u32 pid;
	__u64 code;          /* the code object's address and tag (GS_PY_CODE_TAG_SHIFT) */
	__s32 firstlineno;
	__u32 linetable_len;
	char qualname[GS_PY_NAME_LEN];
	char filename[GS_PY_FILE_LEN];
	__u8 linetable[GS_PY_LINETABLE_LEN];
};

/* ---- Unwinding from .eh_frame in BPF (--call-stacks eh-frame, --sample-unwind eh-frame) ----
 * User space compiles each mapped file's call frame information into rows (one per address
 * range with the same rules, sorted by address; src/symbolize/unwind_table.h) and stores them
 * in one shared array, `unwind_rows`; each process has a sorted table of its executable
 * mappings naming their rows (`unwind_procs`). At a CUDA call or sample the BPF side walks the
 * stack with them: the CFA from rsp or rbp, the return address at CFA - 8 (x86-64), rbp from
 * where the rules say it was saved. */
enum gs_cfa_rule {
	GS_CFA_NONE = 0,        /* no frame information here (a gap between FDEs) */
	GS_CFA_RSP = 1,         /* CFA = rsp + off */
	GS_CFA_RBP = 2,         /* CFA = rbp + off */
	GS_CFA_PLT = 3,         /* a PLT entry: CFA = rsp + 8 + ((rip & 15) >= off ? 8 : 0) */
	GS_CFA_DEREF_RBP = 4,   /* CFA = *(rbp + off): a function that realigned its stack */
	GS_CFA_OUTERMOST = 5,   /* the return address is undefined: the stack ends here */
	GS_CFA_UNSUPPORTED = 6, /* a rule the walker does not know (another register, an expression) */
};

enum gs_rbp_rule {
	GS_RBP_SAME = 0,        /* rbp is the caller's */
	GS_RBP_AT_CFA = 1,      /* the caller's rbp is saved at CFA + off */
	GS_RBP_AT_RBP = 2,      /* ... at rbp + off (realigned frames) */
	GS_RBP_UNKNOWN = 3,     /* clobbered, or a rule the walker does not know */
};

/* Offsets are in 8-byte words: CFI offsets on x86-64 are (rules with others are unsupported). */
struct gs_unwind_row {
	__u32 pc;        /* the first address it applies to, minus its table's base */
	__u8 rules;      /* gs_cfa_rule | gs_rbp_rule << 4 */
	__s8 rbp_off;    /* words */
	__s16 cfa_off;   /* words; GS_CFA_PLT: the (rip & 15) threshold itself */
};

#define GS_UNWIND_MAX_MAPPINGS 512  /* executable mappings per process with a table */
#define GS_MAX_NATIVE_DEPTH 127     /* frames an eh-frame walk keeps */

/* A table's page index narrows the row search to a few rows: it follows the table's rows in
 * unwind_rows, two __u32 entries per 8-byte slot (entry k in slot table_off + table_len + k / 2,
 * its low half if k is even). Entry k counts the rows whose pc is below k << index_shift, so the
 * row for a pc is among entries [pc >> index_shift] .. [(pc >> index_shift) + 1] of the rows. The
 * shift is chosen per table for a few rows a bucket (src/symbolize/unwind_table.h). */
struct gs_unwind_mapping {
	__u64 start, end;  /* the process's addresses */
	__u64 pc_delta;    /* ip - pc_delta: the pc the table's rows are in */
	__u32 table_off;   /* first row in unwind_rows */
	__u32 table_len;   /* rows; 0: no table (yet: see flags), walked with frame pointers */
	__u32 index_len;   /* index entries (buckets + 1, the last = table_len); 0: none */
	__u16 index_shift; /* bytes of pc a bucket covers, log2 */
	__u16 flags;       /* gs_unwind_mapping_flags */
};

/* Tables are compiled when a walk first needs them (a process maps ~80 files, a few of which are
 * ever in its stacks), on user space's worker threads, while the program runs on. */
enum gs_unwind_mapping_flags {
	/* The file's table is not there yet but can be: a walk that needs it asks for it
	 * (unwind_files_wanted) and sends a copy of the stack instead (GS_REC_STACK_COPY, or a sample
	 * with its stack copy), which user space unwinds from .eh_frame meanwhile. */
	GS_UNWIND_MAP_PENDING = 1 << 0,
};

/* A file a walk needed a table for (key of unwind_files_wanted): the mapping's start names it. */
struct gs_unwind_file_want {
	__u32 tgid;
	__u32 pad;
	__u64 start;
};

struct gs_unwind_proc {
	__u32 nr;          /* mappings used, sorted by start */
	__u32 gen;         /* changes whenever the entry does: walks cached per thread are stale */
	struct gs_unwind_mapping maps[GS_UNWIND_MAX_MAPPINGS];
};

enum gs_native_stack_flags {
	GS_NATIVE_COMPLETE = 1 << 0,  /* the walk reached a frame whose rules say the stack ends, or
	                               * (frame pointers) the outermost frame's null one */
	GS_NATIVE_FP_END = 1 << 1,    /* a frame-pointer walk ended at a frame pointer that is none:
	                               * the C library's outermost frames keep no frame pointer either,
	                               * so a stack that reached main ends so too; not a cut */
	GS_NATIVE_ONCE = 1 << 2,      /* for the next record naming it only (a CPU sample's): not kept */
};

/* A stack walked in BPF, sent the first time it is seen in its process; records carry its id. */
struct gs_native_stack_record {
	__u16 kind;          /* GS_REC_NATIVE_STACK */
	__u16 nr;            /* ips[] used; the record is cut after them */
	__u32 pid;
	__u64 id;            /* a hash of the process, the frames and the flags; never 0 */
	__u32 flags;         /* gs_native_stack_flags */
	__u32 pad;
	__u64 ips[GS_MAX_NATIVE_DEPTH];
};

/* --stack-budget: what a process's walks of sampled calls' stacks (launches', copies',
 * memsets') cost, per CPU (bpf: stack_costs, by tgid); user space sets the process's one in N in
 * stack_rates from it (record/stack_budget.h). */
#define GS_STACK_RATE_SLOTS 4096  /* a power of two */
#define GS_STACK_RATE(tgid, every) (((__u64)(every) << 32) | (__u32)(tgid))
#define GS_STACK_RATE_TGID(rate) ((__u32)(rate))
#define GS_STACK_RATE_EVERY(rate) ((__u32)((rate) >> 32))
struct gs_stack_cost {
	__u64 walk_ns;   /* from the probe's entry to the walks' end */
	__u64 walks;
	__u64 first_ns;  /* the process's first charged walk (on the CPU that made the entry; 0 on others) */
};

/* Targets' tgids in a .bss array indexed by tgid % GS_TARGET_SLOTS, ahead of the targets hash:
 * see is_target in common.bpf.h. */
#define GS_TARGET_SLOTS 1024  /* a power of two */

/* What the BPF stack walks did, summed over CPUs (bpf: unwind_stats, one array of these per CPU):
 * for eh-frame walks, how often a frame's step came from the thread's last walk instead of the
 * tables, and how the rest found their rows; for both kinds, the pages of stack read. */
enum gs_unwind_stat {
	GS_UNWIND_STAT_WALKS,
	GS_UNWIND_STAT_FRAMES,
	GS_UNWIND_STAT_FRAMES_REUSED,
	GS_UNWIND_STAT_ROWS_CACHED,    /* rows found in the per-CPU row cache */
	GS_UNWIND_STAT_ROWS_SEARCHED,  /* rows searched for in the tables */
	GS_UNWIND_STAT_PAGES_READ,     /* stack pages read (a probe read each) */
	GS_UNWIND_STAT_FP_WALKS,       /* frame-pointer walks (--call-stacks fp, --sample-unwind fp) */
	GS_UNWIND_STAT_FP_FRAMES,
	GS_UNWIND_STAT_FP_PAGES_READ,
	GS_UNWIND_STAT_PY_WALKS,       /* Python walks that found frames */
	GS_UNWIND_STAT_PY_FRAMES,      /* their frames, 3.12+'s shim frames included */
	GS_UNWIND_STAT_PY_READS,       /* their probe reads of frames: pages, and frames read apart */
	GS_UNWIND_STAT_COPIES,         /* stacks sent as copies: a table their walk needed was pending */
	GS_UNWIND_STAT_NR,
};

/* Causes of lost information, counted per CPU in the `lost` map: each cause's enum name and the
 * name user space reports it by (attach::lost_cause_name, the record's `lost` table, the agent's
 * cause label). */
#define GS_LOST_CAUSES(X) \
	X(GS_LOST_RINGBUF_FULL, "ringbuf_full")         /* no room to reserve a record */ \
	X(GS_LOST_PENDING_FULL, "pending_full")         /* no slot to keep an entry until its return */ \
	X(GS_LOST_RETURN_ORPHAN, "return_orphan")       /* return without a matching entry (attached mid-call) */ \
	X(GS_LOST_STACK, "stack")                       /* a kernel stack's id unavailable (map full or hash collision) */ \
	X(GS_LOST_DEREF, "deref")                       /* user memory behind an argument could not be read */ \
	X(GS_LOST_TARGETS_FULL, "targets_full")         /* a target's child could not be followed */ \
	X(GS_LOST_PY_STACK, "python_stack")             /* a Python stack could not be walked or sent */ \
	/* An eh-frame walk cut short (the frames before the cut are kept), by why: a frame in code \
	 * without a table (walked on with frame pointers), or a process without tables yet (the \
	 * whole stack from frame pointers); */ \
	X(GS_LOST_UNWIND_NO_TABLE, "unwind_no_table") \
	X(GS_LOST_UNWIND_NO_ROW, "unwind_no_row")       /* an address without frame information (hand-written code) */ \
	X(GS_LOST_UNWIND_UNSUPPORTED, "unwind_unsupported_rule")  /* a frame rule the walker does not know */ \
	/* the stack could not be read where the rules point, or went backwards; */ \
	X(GS_LOST_UNWIND_READ, "unwind_read_fault") \
	X(GS_LOST_UNWIND_DEPTH, "unwind_depth")         /* deeper than GS_MAX_NATIVE_DEPTH */ \
	X(GS_LOST_UNWIND_SEND, "unwind_stack_send")     /* a new stack found no room in the ring buffer */ \
	/* A stack walked along frame pointers instead of sent as a copy while a table (or the \
	 * walker) it needed was not there yet: copies past GS_STACK_COPIES_PER_S, or the ring half \
	 * full. */ \
	X(GS_LOST_UNWIND_COPY_LIMIT, "unwind_copy_limit") \
	/* RDMA verbs: work requests or completions past GS_VERBS_MAX_ITEMS in one call (each one \
	 * counted, up to GS_VERBS_COUNT_LIMIT a post), and contexts past the map of contexts \
	 * to resolve (their QPs' posts and completions are not probed) */ \
	X(GS_LOST_VERBS_ITEMS, "verbs_items") \
	X(GS_LOST_VERBS_CONTEXTS, "verbs_contexts_full") \
	/* a host mapping sent without its native stack: past GS_HOST_ALLOC_COPIES_PER_S, or the ring \
	 * half full */ \
	X(GS_LOST_HOST_ALLOC_STACK, "host_alloc_stack")

#define GS_LOST_ENUM_ENTRY(cause, name) cause,
enum gs_lost_cause {
	GS_LOST_CAUSES(GS_LOST_ENUM_ENTRY)
	GS_LOST_NR,
};
#undef GS_LOST_ENUM_ENTRY

/* The layout both sides agree on, checked by each side's compiler (clang for BPF, the host's for
 * user space): a field added, removed or moved fails the build here first. Records sent cut short
 * (after their used frames) still have these sizes in full. */
#ifdef __cplusplus
#define GS_STATIC_ASSERT static_assert
#else
#define GS_STATIC_ASSERT _Static_assert
#endif
#define GS_ASSERT_SIZE(type, n) GS_STATIC_ASSERT(sizeof(type) == (n), #type " changed size: update both sides")
#define GS_ASSERT_AT(type, field, n) GS_STATIC_ASSERT(__builtin_offsetof(type, field) == (n), #type "." #field " moved")
GS_ASSERT_SIZE(struct gs_call_record, 296);
GS_ASSERT_SIZE(struct gs_call_record_long, 424);
GS_ASSERT_SIZE(struct gs_batch_entry, 32);
GS_ASSERT_SIZE(struct gs_batch3d_entry, 80);
GS_ASSERT_SIZE(struct gs_libload_record, 312);
GS_ASSERT_SIZE(struct gs_stop_count, 16);
GS_ASSERT_SIZE(struct gs_file_key, 16);
GS_ASSERT_SIZE(struct gs_proc_record, 40);
GS_ASSERT_SIZE(struct gs_sample_record, 56);
GS_ASSERT_SIZE(struct gs_user_regs, 64);
GS_ASSERT_SIZE(struct gs_sample_stack_record, 16512);
GS_ASSERT_SIZE(struct gs_stack_copy_record, 16472);
GS_ASSERT_SIZE(struct gs_py_offsets, 38);
GS_ASSERT_SIZE(struct gs_py_process, 48);
GS_ASSERT_SIZE(struct gs_py_frame, 16);
GS_ASSERT_SIZE(struct gs_py_stack_record, 2072);
GS_ASSERT_SIZE(struct gs_py_code_record, 2456);
GS_ASSERT_SIZE(struct gs_unwind_row, 8);
GS_ASSERT_SIZE(struct gs_unwind_mapping, 40);
GS_ASSERT_SIZE(struct gs_unwind_file_want, 16);
GS_ASSERT_SIZE(struct gs_unwind_proc, 20488);
GS_ASSERT_SIZE(struct gs_native_stack_record, 1040);
GS_ASSERT_SIZE(struct gs_stack_cost, 24);
/* Records are told apart by the kind at their start (and, for two, by their size). */
GS_ASSERT_AT(struct gs_call_record, kind, 0);
GS_ASSERT_AT(struct gs_libload_record, kind, 0);
GS_ASSERT_AT(struct gs_proc_record, kind, 0);
GS_ASSERT_AT(struct gs_sample_record, kind, 0);
GS_ASSERT_AT(struct gs_sample_stack_record, s, 0);
GS_ASSERT_AT(struct gs_stack_copy_record, kind, 0);
GS_ASSERT_AT(struct gs_py_stack_record, kind, 0);
GS_ASSERT_AT(struct gs_py_code_record, kind, 0);
GS_ASSERT_AT(struct gs_native_stack_record, kind, 0);
GS_ASSERT_AT(struct gs_call_record_long, r, 0);
/* Variable-length records are cut after their last used entry: the array comes last. */
GS_ASSERT_AT(struct gs_py_stack_record, frames, 24);
GS_ASSERT_AT(struct gs_native_stack_record, ips, 24);

/* A GS_REC_FUNCTION_NAME: `length` bytes of name follow (no terminating 0). */
struct gs_function_name_record {
	__u16 kind;          /* GS_REC_FUNCTION_NAME */
	__u16 length;
	__u32 pid;
	__u64 function;      /* CUfunction */
	char name[];
};

/* Each feature's records beside its part: host telemetry (host.bpf.c), host allocations
 * (host_allocs.bpf.c). */
#include "host_events.h"
#include "host_alloc_events.h"

#endif
