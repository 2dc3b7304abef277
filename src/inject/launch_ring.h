/* The ring a CUDA process's launches go through to gpuscope without a trap or a system call each
 * (issue 33): libgpuscope_launches.so, preloaded into a program that `gpuscope record` starts,
 * wraps the driver's launch entry points (and cuKernelGetFunction, which names what cuBLASLt
 * launches) and writes one record per call into a ring in a sealed
 * memfd (its size cannot change under the reader). At its first lookup of a launch entry point a
 * process sends the memfd to gpuscope's datagram socket GPUSCOPE_LAUNCH_RING/rings.sock
 * (SCM_RIGHTS, with a gs_launch_ring_hello); gpuscope maps it and drains it, also after the
 * process has ended.
 *
 * Many writers (the process's threads), one reader. A writer reserves a slot by moving `head` on
 * with a compare-and-swap, only while the ring has room (a full ring never blocks a launch: the
 * launch is counted in `lost`), writes the record and then publishes it by storing its sequence
 * number (its position + 1) last, with release order. The reader takes slots in order while their
 * sequence number is the one it expects, and moves `tail` on. A writer that stops between its
 * reservation and its publication (the process killed) leaves the reader waiting at that slot:
 * what came before it was read.
 *
 * Times are CLOCK_MONOTONIC nanoseconds, the clock of gpuscope's probes, or the TSC's ticks
 * (the header says which), which the reader converts.
 *
 * After the records, the names of the functions the process launched (version 4): the hooks ask
 * the driver for a function's name (cuFuncGetName) the first time they see it launched and
 * append it here, whether or not anyone reads the ring yet, so that a gpuscope that attaches
 * later names kernels loaded before it came. Entries (gs_launch_name) are reserved by moving
 * `names_head` on by their size and published by storing `ready` last; a full area counts the
 * names it could not hold in `names_lost`.
 *
 * A process not started by gpuscope (GPUSCOPE_LAUNCH_RING unset: the library preloaded into a
 * service by its owner) keeps its ring to itself, in standby: `paused`, with no reader, the hooks
 * write nothing but names. `gpuscope record --pid` opens it through /proc/PID/map_files (the
 * memfd is named GS_LAUNCH_RING_MEMFD), claims it by setting `reader_pid`, clears `paused`, and
 * at its end sets `paused` again and gives the claim back. */
#ifndef GPUSCOPE_LAUNCH_RING_H
#define GPUSCOPE_LAUNCH_RING_H

#include <stdint.h>

#define GS_LAUNCH_RING_ENV "GPUSCOPE_LAUNCH_RING"
/* The ring's stack_every until gpuscope sets it (0 if unset). */
#define GS_LAUNCH_STACK_EVERY_ENV "GPUSCOPE_LAUNCH_STACK_EVERY"
#define GS_LAUNCH_RING_MAGIC "GSLNCH1"
#define GS_LAUNCH_RING_VERSION 4
#define GS_LAUNCH_RING_MEMFD "gpuscope-launches"
#define GS_LAUNCH_RING_SOCKET "rings.sock"
#define GS_LAUNCH_RING_SLOTS_DEFAULT (1u << 16) /* 4 MiB of records */
#define GS_LAUNCH_NAMES_BYTES_DEFAULT (2u << 20) /* ~5,000 mangled names of PyTorch's length */
#define GS_LAUNCH_NAME_MAX 4095u                 /* longer names are cut there */

/* What was called. The reader names each as the function gpuscope's probes would (cuda/functions). */
enum gs_launch_api {
  GS_LAUNCH_CU_LAUNCH_KERNEL = 1,
  GS_LAUNCH_CU_LAUNCH_KERNEL_PTSZ = 2,
  GS_LAUNCH_CU_LAUNCH_KERNEL_EX = 3,
  GS_LAUNCH_CU_LAUNCH_KERNEL_EX_PTSZ = 4,
  GS_LAUNCH_CU_LAUNCH_COOPERATIVE_KERNEL = 5,
  GS_LAUNCH_CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ = 6,
  GS_LAUNCH_CU_GRAPH_LAUNCH = 7,
  GS_LAUNCH_CU_GRAPH_LAUNCH_PTSZ = 8,
  /* Not a launch: cuBLASLt asks for a kernel's function before each of its launches, and a
   * launch names its kernel by that function. `function` is the CUkernel asked about, `stream`
   * the CUfunction the driver wrote (0 where it failed); no stack is taken for it. */
  GS_LAUNCH_CU_KERNEL_GET_FUNCTION = 9,
  GS_LAUNCH_API_COUNT = 10,
};

/* The clock of a ring's times (its header's `clock`). */
#define GS_LAUNCH_CLOCK_MONOTONIC 0u /* CLOCK_MONOTONIC nanoseconds */
/* The CPU's time-stamp counter, where the kernel's clock source is the TSC (one counter for all
 * CPUs, at one rate): half the cost of clock_gettime a read. The reader converts the ticks. */
#define GS_LAUNCH_CLOCK_TSC 1u

/* How the wrapper was reached (flags). */
#define GS_LAUNCH_VIA_PROC_ADDRESS 0x1u /* a pointer cuGetProcAddress handed out */
#define GS_LAUNCH_VIA_SYMBOL 0x2u       /* a call bound to the symbol (the preload interposed it) */
#define GS_LAUNCH_STACK_LEFT_OUT 0x4u   /* stacks are taken for 1 launch in N, and not this one's */

struct gs_launch_record {
  uint64_t seq;       /* position + 1, stored last: the record is whole once it reads so */
  uint64_t ts_ns;     /* entry, in the ring's clock (nanoseconds once read by gpuscope) */
  uint64_t function;  /* CUfunction; a graph launch: its CUgraphExec */
  uint64_t stream;    /* CUstream as passed (0: the default stream) */
  uint32_t tid;
  uint32_t grid_x;
  uint16_t grid_y, grid_z;
  uint16_t block_x, block_y;
  uint16_t block_z;
  uint16_t api;       /* gs_launch_api */
  uint32_t shared_mem;
  uint32_t duration_ns; /* entry to return in the ring's clock, saturated */
  uint16_t result;      /* CUresult (all below 1000) */
  uint16_t flags;
};

/* At the start of the file, then `slots` records (a power of two). Counters on their own cache
 * lines: writers move `head`, the reader `tail`. */
struct gs_launch_ring_header {
  char magic[8]; /* GS_LAUNCH_RING_MAGIC */
  uint32_t version;
  uint32_t record_size; /* sizeof(struct gs_launch_record) */
  uint32_t slots;
  uint32_t pid;
  uint64_t created_ns;
  uint32_t reader_pid; /* set by gpuscope once it maps the ring */
  /* Set by gpuscope: 0, no stacks; N, one launch in N (at random) is handed to the probed
   * gpuscope_launch_stack for its stack instead of being written here. */
  uint32_t stack_every;
  uint32_t clock; /* GS_LAUNCH_CLOCK_*: the records' times */
  /* Nonzero: launches go straight to the driver, unrecorded (their cuKernelGetFunction calls
   * still are). gpuscope never sets it; bench/gpu/hooks_ab.py does, to measure what the hooks
   * add to a step inside one process. */
  uint32_t paused;
  uint32_t names_offset; /* where the names start: after the records */
  uint32_t names_bytes;  /* the names' area, a multiple of 8 */
  uint8_t pad0[8];
  uint64_t head; /* next position to reserve (writers) */
  uint8_t pad1[56];
  uint64_t tail; /* next position to read (the reader) */
  uint8_t pad2[56];
  uint64_t lost; /* launches not written (the ring was full): head + lost were made */
  uint64_t names_head; /* bytes of the names' area reserved (may run past names_bytes: full) */
  uint64_t names_lost; /* functions whose names did not fit */
  uint8_t pad3[40];
};

/* A function's name in the names' area, 8-aligned; the next entry starts at
 * GS_LAUNCH_NAME_SIZE(length) bytes after this one's start. */
struct gs_launch_name {
  uint64_t function; /* CUfunction */
  uint32_t length;   /* bytes of the name (no terminating 0 counted; one follows) */
  uint32_t ready;    /* 1 once the whole entry is written (stored last, with release order) */
  char name[];
};
#define GS_LAUNCH_NAME_SIZE(length) ((sizeof(struct gs_launch_name) + (length) + 1 + 7) & ~(uint64_t)7)

/* The datagram that carries a ring's descriptor. */
struct gs_launch_ring_hello {
  char magic[8]; /* GS_LAUNCH_RING_MAGIC */
  uint32_t pid;
  uint32_t reserved;
};

#ifdef __cplusplus
static_assert(sizeof(struct gs_launch_record) == 64, "one cache line a launch");
static_assert(sizeof(struct gs_launch_ring_header) == 256, "the records start on a cache line");
#endif

#endif
