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

/* The parts, in the order they build on each other. */
#include "common.bpf.h"
#include "unwind_ehframe.bpf.c"
#include "unwind_fp.bpf.c"
#include "stack_copy.bpf.c"
#include "python.bpf.c"
#include "calls.bpf.c"
#include "procs.bpf.c"
#include "host.bpf.c"
#include "samples.bpf.c"
#include "host_allocs.bpf.c"
#include "libload.bpf.c"
#include "verbs.bpf.c"

char LICENSE[] SEC("license") = "GPL";
