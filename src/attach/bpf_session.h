// Owns every kernel object gpuscope creates: the loaded BPF programs and maps, the tracepoint
// and uprobe links, the ring buffer. Destroying it detaches everything, whatever the path out.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "attach/link_closer.h"
#include "events.h"

struct gpuscope_bpf;
struct bpf_link;
struct ring_buffer;
struct bpf_program;

namespace gpuscope::attach {

struct SessionConfig {
  bool filter_targets = true;  // false: every process on the host
  bool capture_stacks = true;
  bool stop_for_shared_objects = true;  // see bpf: stop_for_shared_objects
  uint32_t ringbuf_bytes = 64u << 20;
  uint32_t wakeup_bytes = 4u << 20;
  // Kernel stacks of CPU samples go to a stack map of this many entries (user stacks are walked
  // in BPF and sent in the ring buffer, see walk_user_stacks); 0: no samples, a one-entry map.
  uint32_t stack_map_entries = 8192;
  // A second stack map of the same size, so that stack generations can be flipped and the
  // old one emptied (see GS_STACK_GEN_BIT); without it, stacks_alt has one entry and is unused.
  bool stack_generations = false;
  // Ask the kernel to count each program's runs and run time (BPF_ENABLE_STATS): two clock
  // reads per run, so off unless asked for.
  bool program_stats = false;
  // Where enabling them is refused (BPF_ENABLE_STATS needs CAP_SYS_ADMIN), go on without.
  bool program_stats_optional = false;
  // CPU samples carry registers and a copy of the user stack, unwound in user space from
  // .eh_frame; false: walked in BPF (frame pointers, or the unwind tables).
  bool sample_stack_copy = false;
  bool call_stack_copy = false;  // the same for CUDA calls' stacks
  // Launches', copies' and memsets' stacks taken for one in N, chosen at random
  // (GS_CALL_STACK_SAMPLED); 1: all.
  uint32_t stack_every = 1;
  // Instead, N is set per process with set_stack_rate (none set: 1), and the walks of those
  // calls' stacks are timed per process (stack_costs): record/stack_budget.h.
  bool stack_budget = false;
  // Walk CUDA calls' (samples') user stacks in BPF with the unwind tables given by
  // set_unwind_process; processes without tables get frame-pointer stacks.
  bool call_unwind_tables = false;
  bool sample_unwind_tables = false;
  // Whether any user stack is walked (call stacks or CPU samples): sizes the walk's maps.
  bool walk_user_stacks = true;
  uint32_t unwind_rows = 16u << 20;  // capacity of the shared row array (8-byte slots: 128 MiB)
  // Runtime launches (cudaLaunchKernel...) reach the driver's launch functions, so probing both
  // traps twice per launch. false: attach only the driver's (see detach_runtime_launch_probes).
  bool runtime_launch_probes = true;
  // false: no launch (nor cuKernelGetFunction) is probed for every process: they come from the
  // processes' own launch rings (record --launch-probes in-process, record/launch_rings.h). A process without
  // them gets its launch probes of its own, by set_high_rate_probes.
  bool launch_probes = true;
  // With launch_probes false: the runtime's launch probes too are a process's own (processes
  // joined late, whose kernels loaded before are named by the runtime's host stubs where they
  // have no ring: record --pid).
  bool runtime_launches_per_process = false;
  // Walk the Python frames of the processes given to set_python_process at every CUDA call
  // that has a stack, and in CPU samples.
  bool python_stacks = false;
  // High-rate probes (launches, copies, memsets) are not attached for every process but per
  // process, by set_high_rate_probes: each process's can be switched on and off.
  bool high_rate_per_process = false;
  // With filter_targets false: CPU samples only of processes given to add_target.
  bool sample_only_targets = false;
  // Benchmarks: every CUDA probe (entry and return) runs a program that does nothing, so that
  // a run measures the traps alone, on exactly the functions the real probes would take.
  bool floor_probes = false;
  // Host telemetry (bpf/host.bpf.c): where each target thread's time goes, from the scheduler's
  // tracepoints. With filter_targets off, only the processes given to add_host_process (and
  // their children) are followed.
  bool host_telemetry = false;
  // Host allocations (bpf/host_allocs.bpf.c): the targets' anonymous mappings of this size and
  // more, with their stacks, and their unmapping; 0: off (not even loaded).
  uint64_t host_alloc_min_bytes = 0;
};

struct AttachResult {
  int runtime_probes = 0;
  int driver_probes = 0;
  int nccl_probes = 0;
  bool already_attached = false;
  // When the file's last probe was in place, if it has driver probes (0 if not, or failed); for a
  // file attached before, that attach's.
  uint64_t driver_probed_ns = 0;
  std::string build_id;
  std::string error;
};

// Kernel-side counters of what could not be recorded, by cause (bpf/events.h).
using LostCounts = std::array<uint64_t, GS_LOST_NR>;
std::string_view lost_cause_name(int cause);

// BPF_TRACE_UPROBE_MULTI, newer than libbpf 1.1's headers.
constexpr uint32_t kAttachUprobeMulti = 48;

// One uprobe-multi link of program `prog_fd` on `offsets` of the file at `path` (a return probe
// with `retprobe`), each with its cookie; with a pid, planted in that process alone. Returns the
// link's fd, or -1 with errno set.
int attach_uprobe_multi(int prog_fd, const std::string& path, const std::vector<uint64_t>& offsets,
                        const std::vector<uint64_t>& cookies, bool retprobe, pid_t pid = 0);

class BpfSession {
 public:
  // Loads the programs and attaches the tracepoints. Throws Error with what to do.
  explicit BpfSession(const SessionConfig& cfg);
  ~BpfSession();
  BpfSession(const BpfSession&) = delete;
  BpfSession& operator=(const BpfSession&) = delete;

  // A probe on a program of its own (not the CUDA catalogue's: verbs.bpf.c's), by the program's
  // name, kept until the session ends. Throws Error where it cannot be placed.
  void attach_program(const char* program, const std::string& path, uint64_t offset, uint64_t cookie,
                      bool retprobe);
  // A map's fd by its name in the object (-1 if none).
  int map_fd(const char* name) const;
  // The probes on the heap hooks of libgpuscope_launches.so at `path` (gpuscope_heap_alloc and
  // gpuscope_heap_free), for every process that maps it; where host allocations are recorded.
  // Throws Error where they cannot be placed.
  void attach_heap_hooks(const std::string& path);

  void add_target(pid_t pid);
  void remove_target(pid_t pid);
  // Host telemetry with filter_targets off: the process (and its children from now on) is followed.
  void add_host_process(pid_t pid);
  bool host_telemetry() const { return host_telemetry_; }
  // The process runs CPython: where its runtime state is and how that version lays it out.
  // Forked children inherit it on the BPF side; exec and exit remove it. False if the map is full.
  bool set_python_process(pid_t pid, const gs_py_process& proc);
  // Samples every CPU with the perf software cpu-clock at `hz` per second (no hardware PMU
  // needed); target threads' samples become GS_REC_SAMPLE records. Throws Error with what to do.
  void start_cpu_sampling(int hz);
  // Unwind tables (bpf: unwind_rows, unwind_procs). Rows are written in place, in the shared
  // array mapped into our memory, before a process's mapping table names them.
  gs_unwind_row* unwind_rows() const { return unwind_rows_; }
  uint32_t unwind_rows_capacity() const { return unwind_rows_cap_; }
  bool unwind_tables_enabled() const { return unwind_rows_ != nullptr; }
  // How long after the first programs the eh-frame walker's were in place (0: not yet, or not
  // used); negative: they could not be loaded, and stacks are walked along frame pointers.
  int64_t walker_delay_ns() const { return walker_delay_ns_.load(); }
  // Waits up to `timeout_ns` for the walker's programs to be in place (or to have failed).
  void wait_for_walker(uint64_t timeout_ns) const;
  // False if the map is full.
  bool set_unwind_process(pid_t pid, const gs_unwind_proc& proc);
  void remove_unwind_process(pid_t pid);
  // Processes whose walks asked for their mappings to be read again (bpf: unwind_wanted).
  std::vector<pid_t> unwind_wanted() const;
  void clear_unwind_wanted(pid_t pid);
  // Files whose pending table a walk needed (bpf: unwind_files_wanted).
  std::vector<gs_unwind_file_want> unwind_files_wanted() const;
  void clear_unwind_file_wanted(const gs_unwind_file_want& want);
  // Lets the BPF side send these stacks again (bpf: native_stacks_sent): user space forgot them.
  void forget_native_stacks(const std::vector<uint64_t>& ids);
  // Empties the map of Python stacks sent: each is sent again when next walked.
  void forget_python_stacks();
  // The stops the BPF side makes at a library's load and those answered (stop_guardian.h): maps a
  // guardian holds with stop_guard_fd(), which it turns on once it watches.
  int stops_made_fd() const;
  int stops_answered_fd() const;
  int stop_guard_fd() const;  // whether processes may be stopped (see bpf: stop_guard)
  uint32_t stopping_program_id() const;  // the kernel's id of the program that stops them
  bool stops_guarded() const;
  // Notes that `stop` (from its libload record) was answered with SIGCONT: sent before, so that
  // a guardian continues the process if gpuscope dies in between.
  void answer_stop(pid_t pid, const gs_stop_count& stop);
  // Tells the BPF side not to stop processes again for this file (see bpf: checked_files).
  void mark_checked(uint64_t dev, uint64_t ino);
  // Detaches the tracepoint that stops processes at library loads. Called first when the
  // recording ends, so that no process is stopped after the last stop gpuscope will answer.
  void stop_stopping_processes();
  // Attaches a uprobe to every probed CUDA function the ELF file at `path` defines. Files are
  // identified by device and inode, so a library reached through several paths is probed once.
  AttachResult attach_file(const std::string& path);
  // An entry-only probe at a file offset, in every process mapping the file, that records a
  // call of function `func` with the caller's stack (decode/handoffs.h). Throws Error.
  void attach_entry_probe(const std::string& path, uint64_t offset, uint16_t func);
  // Removes the launch probes of every runtime library attached so far, and attaches none to
  // runtimes found later. Once the driver is probed, each launch is recorded by its driver
  // probe alone, one trap instead of two. Returns how many runtime files lost their probes.
  int detach_runtime_launch_probes();
  bool runtime_launch_probes() const { return runtime_launch_probes_; }
  // Removes the probes of these runtime functions (cuda::may_be_recorded_by_driver) from every
  // file attached so far, and attaches none to files found later: the driver calls they make
  // record them. The links close on a thread of their own, since each removal waits for an RCU
  // grace period and the caller drains the ring buffer (see LinkCloser). Returns how many links
  // go.
  int detach_runtime_functions(const std::vector<uint16_t>& funcs);
  // With high_rate_per_process: attaches (on) or removes (off) the process's high-rate probes
  // in every file attached so far and, while on, in files attached later. Returns the number
  // of links made or removed; throws Error if the kernel refuses. Links removed close on the
  // LinkCloser's threads: this returns without waiting for them. `only` (on): probe just these
  // functions (cuda::FunctionSpec ids) in the files attached so far; null: every high-rate one.
  int set_high_rate_probes(pid_t pid, bool on, const std::set<uint16_t>* only = nullptr);
  // Removes what a process that exited still holds.
  void forget_process(pid_t pid);
  size_t processes_with_high_rate_probes() const { return high_rate_links_.size(); }

  // Called with each record, on the thread that calls poll(). Returns after `timeout_ms` or
  // once the kernel woke it and everything available was consumed.
  using RecordHandler = std::function<void(const void* data, size_t size)>;
  void set_handler(RecordHandler h) { handler_ = std::move(h); }
  int poll(int timeout_ms);

  // The stack behind an id, innermost first, from the map its generation bit names.
  std::vector<uint64_t> stack(int32_t id) const;
  // With stack_generations: the generation BPF captures into (0 or 1).
  int stack_generation() const;
  // Switches captures to the other generation; returns it. Ids of the one before stay
  // readable until clear_stacks.
  int flip_stack_generation();
  // Deletes every entry of a generation's map (not the current one's); returns how many.
  size_t clear_stacks(int generation);
  uint32_t stack_map_entries() const { return stack_map_entries_; }
  LostCounts lost() const;
  // The eh-frame walks' counters (gs_unwind_stat), summed over CPUs.
  std::array<uint64_t, GS_UNWIND_STAT_NR> unwind_stats() const;

  // With stack_budget: what each process's walks of sampled calls' stacks cost so far, summed
  // over CPUs; the N of one in N for its stacks (1: every one); and, for a process that exited,
  // letting go of both.
  struct StackCost {
    pid_t pid = 0;
    uint64_t walk_ns = 0, walks = 0;
    uint64_t first_ns = 0;  // its first walk (CLOCK_MONOTONIC)
  };
  std::vector<StackCost> stack_costs() const;
  // false: the process's slot in stack_rates is another's (tgids GS_STACK_RATE_SLOTS apart).
  bool set_stack_rate(pid_t pid, uint32_t every);
  void forget_stack_budget(pid_t pid);

  // What one probe hit costs on this machine, measured on a function of our own: calls of
  // `target` timed without a probe, with an entry probe, and with a return probe on it.
  struct HitCost {
    double entry_ns = 0, return_ns = 0;
  };
  HitCost measure_hit_cost(int (*target)(int), int calls);

  struct ProgramStats {
    std::string name;
    uint64_t runs = 0, run_time_ns = 0;
  };
  // Runs and run time per program (bpf_prog_info); zero unless program_stats was asked for.
  std::vector<ProgramStats> program_stats() const;
  // Whether this session turned the statistics on (they may also be on system-wide:
  // kernel.bpf_stats_enabled).
  bool program_stats_enabled() const { return stats_fd_ >= 0; }

 private:
  struct LinkDeleter {
    void operator()(bpf_link* l) const;
  };
  struct SkelDeleter {
    void operator()(gpuscope_bpf* s) const;
  };
  struct RingDeleter {
    void operator()(ring_buffer* r) const;
  };
  static int on_record(void* ctx, void* data, size_t size);
  // Attaches one probe (the per-probe path before kernel 6.6); its links go to `into`.
  void attach_probe(const std::string& path, uint64_t offset, uint64_t cookie, bool entry_only, bool with_return,
                    std::vector<std::unique_ptr<bpf_link, LinkDeleter>>& into, pid_t pid = -1);
  struct ProbeSet {
    std::vector<uint64_t> offsets, cookies;
  };
  // Returns the link's fd, or -1 for an empty set.
  int attach_multi(bpf_program* prog, const std::string& path, const ProbeSet& set, bool retprobe, pid_t pid = 0);
  void open_and_load(const SessionConfig& cfg, bool multi);
  // The eh-frame walker's programs: a second load of the call programs with the walker, made on a
  // thread of its own because the verifier takes long over it; the first programs hand their
  // runs to these once they are in (bpf: call_tables_later).
  void load_walker(bool multi);
  std::unique_ptr<gpuscope_bpf, SkelDeleter> load_walker_program(uint32_t k, bool multi, const char** failed, int* err);

  std::unique_ptr<gpuscope_bpf, SkelDeleter> skel_;
  std::unique_ptr<ring_buffer, RingDeleter> ring_;
  std::vector<bpf_program*> host_programs() const;
  std::vector<bpf_program*> host_alloc_programs() const;
  void set_host_pid(pid_t pid, bool on);
  bool host_telemetry_ = false;
  std::vector<std::unique_ptr<bpf_link, LinkDeleter>> links_;
  std::unique_ptr<bpf_link, LinkDeleter> close_link_;
  // One uprobe-multi link (kernel 6.6+) per program and file: attaching and detaching a whole
  // library's probes costs one system call and one RCU grace period, not one per probe.
  bool multi_ = false;
  bool floor_probes_ = false;
  // The CUDA probes' programs: entry-only (launches), entry of a call with a return probe, and
  // that return; with floor_probes all three are the program that does nothing.
  bpf_program* emit_program() const;
  bpf_program* entry_program() const;
  bpf_program* return_program() const;
  std::vector<int> multi_links_;
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> attached_files_;  // (st_dev, st_ino) -> driver_probed_ns
  // Runtime launch probes, kept apart so that they can be removed on their own.
  bool runtime_launch_probes_ = true;
  std::vector<int> runtime_launch_multi_links_;
  std::vector<std::unique_ptr<bpf_link, LinkDeleter>> runtime_launch_links_;
  // Probes of runtime functions that the driver may record instead, by function id, likewise.
  std::map<uint16_t, std::vector<int>> runtime_function_multi_links_;
  std::map<uint16_t, std::vector<std::unique_ptr<bpf_link, LinkDeleter>>> runtime_function_links_;
  std::set<uint16_t> detached_runtime_functions_;
  LinkCloser closer_;
  RecordHandler handler_;
  int stats_fd_ = -1;
  gs_unwind_row* unwind_rows_ = nullptr;  // mmapped unwind_rows, unwind_rows_cap_ rows
  uint32_t unwind_rows_cap_ = 0;
  std::unique_ptr<gpuscope_bpf, SkelDeleter> walkers_[2];  // load_walker's
  std::thread walker_loader_;
  std::atomic<int64_t> walker_delay_ns_{0};
  uint64_t loaded_ns_ = 0;
  uint32_t stack_map_entries_ = 0;
  bool stack_generations_ = false;

  // high_rate_per_process: each attached file's high-rate probes, and each process's links.
  struct HighRateSet {
    // The file, held open: the path it was attached by (/proc/PID/root/...) dies with that
    // process, and later processes' probes go on the same file.
    std::shared_ptr<int> fd;
    std::string path;  // /proc/self/fd/N
    ProbeSet emit;     // entry-only (launches)
    ProbeSet entry;    // with a return probe (copies, memsets)
  };
  struct ProcessLinks {
    std::vector<int> fds;
    std::vector<std::unique_ptr<bpf_link, LinkDeleter>> links;
  };
  bool high_rate_per_process_ = false;
  bool launch_probes_ = true;
  bool runtime_launches_per_process_ = false;
  std::vector<HighRateSet> high_rate_sets_;
  std::map<pid_t, ProcessLinks> high_rate_links_;
  void attach_high_rate(pid_t pid, const HighRateSet& set, ProcessLinks& into, const std::set<uint16_t>* only = nullptr);
  // Closes a process's links on the closer's threads.
  void retire(pid_t pid, ProcessLinks&& links);
};

}  // namespace gpuscope::attach
