// Owns every kernel object gpuscope creates: the loaded BPF programs and maps, the tracepoint
// and uprobe links, the ring buffer. Destroying it detaches everything, whatever the path out.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

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
  uint32_t stack_map_entries = 32768;
  // Ask the kernel to count each program's runs and run time (BPF_ENABLE_STATS): two clock
  // reads per run, so off unless asked for.
  bool program_stats = false;
  // CPU samples carry registers and a copy of the user stack, unwound in user space from
  // .eh_frame; false: frame pointers, walked by the kernel.
  bool sample_stack_copy = false;
  bool call_stack_copy = false;  // the same for CUDA calls' stacks
  // Runtime launches (cudaLaunchKernel...) reach the driver's launch functions, so probing both
  // traps twice per launch. false: attach only the driver's (see detach_runtime_launch_probes).
  bool runtime_launch_probes = true;
  // Walk the Python frames of the processes given to set_python_process at every CUDA call
  // that has a stack, and in CPU samples.
  bool python_stacks = false;
};

struct AttachResult {
  int runtime_probes = 0;
  int driver_probes = 0;
  bool already_attached = false;
  std::string build_id;
  std::string error;
};

// Kernel-side counters of what could not be recorded, by cause (bpf/events.h).
using LostCounts = std::array<uint64_t, GS_LOST_NR>;
std::string_view lost_cause_name(int cause);

class BpfSession {
 public:
  // Loads the programs and attaches the tracepoints. Throws Error with what to do.
  explicit BpfSession(const SessionConfig& cfg);
  ~BpfSession();
  BpfSession(const BpfSession&) = delete;
  BpfSession& operator=(const BpfSession&) = delete;

  void add_target(pid_t pid);
  // The process runs CPython: where its runtime state is and how that version lays it out.
  // Forked children inherit it on the BPF side; exec and exit remove it. False if the map is full.
  bool set_python_process(pid_t pid, const gs_py_process& proc);
  // Samples every CPU with the perf software cpu-clock at `hz` per second (no hardware PMU
  // needed); target threads' samples become GS_REC_SAMPLE records. Throws Error with what to do.
  void start_cpu_sampling(int hz);
  // Tells the BPF side not to stop processes again for this file (see bpf: checked_files).
  void mark_checked(uint64_t dev, uint64_t ino);
  // Detaches the tracepoint that stops processes at library loads. Called first when the
  // recording ends, so that no process is stopped after the last stop gpuscope will answer.
  void stop_stopping_processes();
  // Attaches a uprobe to every probed CUDA function the ELF file at `path` defines. Files are
  // identified by device and inode, so a library reached through several paths is probed once.
  AttachResult attach_file(const std::string& path);
  // Removes the launch probes of every runtime library attached so far, and attaches none to
  // runtimes found later. Once the driver is probed, each launch is recorded by its driver
  // probe alone, one trap instead of two. Returns how many runtime files lost their probes.
  int detach_runtime_launch_probes();
  bool runtime_launch_probes() const { return runtime_launch_probes_; }

  // Called with each record, on the thread that calls poll(). Returns after `timeout_ms` or
  // once the kernel woke it and everything available was consumed.
  using RecordHandler = std::function<void(const void* data, size_t size)>;
  void set_handler(RecordHandler h) { handler_ = std::move(h); }
  int poll(int timeout_ms);

  // The user stack behind an id, innermost first.
  std::vector<uint64_t> stack(int32_t id) const;
  LostCounts lost() const;

  struct ProgramStats {
    std::string name;
    uint64_t runs = 0, run_time_ns = 0;
  };
  // Runs and run time per program (bpf_prog_info); zero unless program_stats was asked for.
  std::vector<ProgramStats> program_stats() const;

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
                    std::vector<std::unique_ptr<bpf_link, LinkDeleter>>& into);
  struct ProbeSet {
    std::vector<uint64_t> offsets, cookies;
  };
  // Returns the link's fd, or -1 for an empty set.
  int attach_multi(bpf_program* prog, const std::string& path, const ProbeSet& set, bool retprobe);
  void open_and_load(const SessionConfig& cfg, bool multi);

  std::unique_ptr<gpuscope_bpf, SkelDeleter> skel_;
  std::unique_ptr<ring_buffer, RingDeleter> ring_;
  std::vector<std::unique_ptr<bpf_link, LinkDeleter>> links_;
  std::unique_ptr<bpf_link, LinkDeleter> close_link_;
  // One uprobe-multi link (kernel 6.6+) per program and file: attaching and detaching a whole
  // library's probes costs one system call and one RCU grace period, not one per probe.
  bool multi_ = false;
  std::vector<int> multi_links_;
  std::set<std::pair<uint64_t, uint64_t>> attached_files_;  // (st_dev, st_ino)
  // Runtime launch probes, kept apart so that they can be removed on their own.
  bool runtime_launch_probes_ = true;
  std::vector<int> runtime_launch_multi_links_;
  std::vector<std::unique_ptr<bpf_link, LinkDeleter>> runtime_launch_links_;
  RecordHandler handler_;
  int stats_fd_ = -1;
};

}  // namespace gpuscope::attach
