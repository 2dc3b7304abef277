// SPDX-License-Identifier: GPL-2.0
/* Part of gpuscope.bpf.c, which includes every part into one object and one skeleton; not
 * compiled on its own. */

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

/* Element 0: 1 while a guardian watches gpuscope; before (or without one) nothing is stopped.
 * The guardian alone sets it: to 1 once it watches, to 0 when gpuscope ends, since a dead
 * gpuscope's programs stay attached until the kernel has released its links. A map, not a
 * global, so that the guardian can hold it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} stop_guard SEC(".maps");

/* Counts a stop of process tgid in stops_made, before it is made; false if it cannot be (the
 * map is full): then the process is not stopped. */
static __always_inline bool count_stop(__u32 tgid, struct gs_stop_count *stop)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	stop->start_ns = BPF_CORE_READ(task, group_leader, start_time);
	stop->pad = 0;
	struct gs_stop_count *made = bpf_map_lookup_elem(&stops_made, &tgid);
	if (made && made->start_ns == stop->start_ns) {
		stop->count = __sync_add_and_fetch(&made->count, 1);
		return true;
	}
	stop->count = 1;
	return bpf_map_update_elem(&stops_made, &tgid, stop, BPF_ANY) == 0;
}

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
		__u32 zero = 0;
		__u32 *guarded = bpf_map_lookup_elem(&stop_guard, &zero);
		if (r->stopped && (!guarded || !*guarded || !count_stop(id >> 32, &r->stop)))
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
