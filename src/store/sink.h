// Where the pipeline puts what it decodes: the record file (RecordWriter) or the agent's
// live aggregates (agent::Aggregator). Called from the pipeline thread, except where said.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model.h"
#include "common/rdma.h"
#include "gpu/nvml.h"
#include "host/pressure.h"

namespace gpuscope::store {

struct StoredFrame {
  int64_t module_id = 0;  // 0: the address fell in no file-backed mapping
  uint64_t offset = 0;    // file offset within the module
  uint64_t ip = 0;
  bool operator==(const StoredFrame&) const = default;
};

// How a thread spent a window of time (host telemetry, bpf/host_events.h): nanoseconds on a CPU,
// runnable, and blocked by kind; the longest wait for a CPU and whom it waited behind; the longest
// blocked stretch and who woke it.
// A large anonymous host mapping of a traced process made, moved or unmade (bpf/host_allocs.bpf.c).
struct HostAllocRow {
  uint64_t ts_ns = 0;
  uint32_t pid = 0, tid = 0;
  std::string op;  // "mmap", "munmap", "mremap"
  uint64_t addr = 0, length = 0;
  uint64_t old_addr = 0;  // mremap: where it was
  int64_t stack_id = 0;   // mmap: the stack that made it (intern_stack; 0: none)
};

struct ThreadTimeRow {
  uint32_t pid = 0, tid = 0;
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t on_cpu_ns = 0, runnable_ns = 0, io_ns = 0, lock_ns = 0, fd_ns = 0, sleep_ns = 0, other_ns = 0;
  uint64_t waited_ns = 0;
  uint32_t waited_for_tid = 0, waited_for_pid = 0;
  std::string waited_for_comm;
  bool waited_for_kthread = false;  // the task that held its CPU is a kernel thread
  uint64_t blocked_ns = 0;
  uint32_t waker_tid = 0, waker_pid = 0;
  std::string waker_comm;
  uint32_t switches = 0, preempted = 0, faults = 0;
  uint64_t reclaim_ns = 0;  // in direct reclaim (part of the states' time)
  uint64_t net_softirq_ns = 0;  // network softirqs run on its CPU while it was on it (part of on_cpu_ns)
  uint64_t sys_ns = 0;          // of on_cpu_ns, system time (system calls, page faults)
  std::string blocked_syscall;  // its longest blocked stretch was in this call ("fsync"), on this
  std::string blocked_on;       // file or socket ("/data/ckpt.pt", "tcp a -> b"); "": unknown
  // Its state at end_ns, kept until its next window ("on_cpu", "runnable", "io", "lock", "fd",
  // "sleep", "other"); "exited" in its last window.
  std::string state;
};

struct LibraryRow {
  uint32_t pid = 0;
  std::string path;
  std::string build_id;
  int runtime_probes = 0;
  int driver_probes = 0;
  uint64_t ts_ns = 0;
  std::string error;
};

class EventSink {
 public:
  virtual ~EventSink() = default;

  // These two from any thread.
  virtual void set_meta(const std::string& key, const std::string& value) = 0;
  virtual void add_gpu(const gpu::GpuDevice& d) = 0;

  virtual void add_call(const CallEvent& e) = 0;
  // Ids the sink hands out; 0 means "none" (a sink may refuse new entries to stay bounded).
  virtual int64_t intern_kernel(const std::string& name, const std::string& demangled) = 0;
  virtual int64_t intern_module(const std::string& path, const std::string& build_id) = 0;
  virtual int64_t intern_stack(const std::vector<StoredFrame>& frames) = 0;
  // A Python frame: its id is the offset of a stack frame in module "[python]".
  virtual int64_t intern_python_frame(const std::string& function, const std::string& file, int line) = 0;
  virtual void upsert_process(uint32_t pid, uint32_t ppid, const std::string& comm, const std::string& cmdline,
                              const std::string& exe, uint64_t ts_ns) = 0;
  virtual void set_process_exit(uint32_t pid, uint64_t ts_ns, int exit_code) = 0;
  virtual void upsert_thread(uint32_t tid, uint32_t pid, const std::string& comm) = 0;
  virtual void add_library(const LibraryRow& lib) = 0;
  // A CPU profile sample; stack ids from intern_stack (0: none).
  virtual void add_sample(uint64_t ts_ns, uint32_t pid, uint32_t tid, uint32_t cpu, int64_t stack_id,
                          int64_t kernel_stack_id) = 0;
  virtual void add_thread_time(const ThreadTimeRow&) {}
  virtual void add_host_alloc(const HostAllocRow&) {}
  // An RDMA verbs call (common/rdma.h): kept by records, not by the agent.
  virtual void add_rdma(const RdmaEvent&) {}
  // A frame's name known only while tracing (kernel frames, from /proc/kallsyms).
  virtual void add_symbol(int64_t module_id, uint64_t offset, const std::string& name) = 0;
  virtual void set_lost(const std::string& cause, uint64_t count) = 0;
  virtual void add_gpu_batch(const gpu::NvmlSampler::Batch& b) = 0;
  // Pressure stall information and CPU quota throttling (host::PressureSampler); kept by records.
  virtual void add_pressure(const host::PressureReading&) {}
  // The end of a batch of events: what came before it may be made visible.
  virtual void commit() = 0;
  // Changes when the sink forgets its stacks (to stay bounded): stack ids it handed out
  // before are void, and the pipeline drops those it cached.
  virtual uint64_t stack_epoch() const { return 0; }
};

}  // namespace gpuscope::store
