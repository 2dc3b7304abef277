#include "record/pipeline.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>

#include "decode/verbs.h"
#include "verbs_events.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "cuda/functions.h"
#include "cuda/handoffs.h"
#include "decode/decoder.h"
#include "discover/proc.h"

namespace gpuscope::record {

namespace {

// A capture file: this, then chunks of [u32 type][u32 size][bytes].
constexpr char kCaptureMagic[16] = "gpuscope-ring-1";
enum CaptureChunk : uint32_t {
  kChunkBatch = 1,            // a batch as the queue holds it: [u32 length][record] ...
  kChunkCompleteHistory = 2,  // u32 pid (mark_complete_history)
  kChunkDriverProbed = 3,     // u32 pid, u64 ts_ns (note_driver_probed)
};

}  // namespace

// Each kind of record: the least size its handler reads, whether the control loop hears of it at
// once (from the ring-buffer thread), and its handler on the pipeline thread (none: not queued).
struct Pipeline::Route {
  uint16_t kind;
  uint32_t min_size;
  bool to_control;
  void (Pipeline::*handle)(const uint8_t*, size_t);
};

namespace {
constexpr uint32_t kNativeStackHeader = offsetof(gs_native_stack_record, ips);
constexpr uint32_t kHostAllocHeader = offsetof(gs_host_alloc_record, stack);
}  // namespace

const Pipeline::Route* Pipeline::route_of(uint16_t kind) {
  static constexpr Route kRoutes[] = {
      {GS_REC_CALL, sizeof(gs_call_record), false, &Pipeline::on_call},
      {GS_REC_LIBLOAD, sizeof(gs_libload_record), true, nullptr},
      // A new program is looked at now by the control loop (static CUDA runtime, Python
      // interpreter), not when the pipeline gets to it: it may lag behind by more than the
      // program takes to start.
      {GS_REC_EXEC, sizeof(gs_proc_record), true, &Pipeline::on_exec},
      {GS_REC_EXIT, sizeof(gs_proc_record), true, &Pipeline::on_exit},
      {GS_REC_FORK, sizeof(gs_proc_record), false, &Pipeline::on_fork},  // sent for forks of Python processes
      {GS_REC_SAMPLE, sizeof(gs_sample_record), false, &Pipeline::on_sample},
      {GS_REC_STACK_COPY, sizeof(gs_stack_copy_record), false, &Pipeline::on_stack_copy},
      {GS_REC_PY_STACK, 0, false, &Pipeline::on_python_stack},  // sized by PythonFrames::on_stack
      {GS_REC_PY_CODE, sizeof(gs_py_code_record), false, &Pipeline::on_python_code},
      {GS_REC_NATIVE_STACK, kNativeStackHeader, false, &Pipeline::on_native_stack},
      {GS_REC_THREAD_TIME, sizeof(gs_thread_time_record), false, &Pipeline::on_thread_time},
      {GS_REC_FUNCTION_NAME, sizeof(gs_function_name_record), false, &Pipeline::on_function_name},
      {GS_REC_VERBS, sizeof(gs_verbs_record), false, &Pipeline::on_verbs},
      {GS_REC_HOST_ALLOC, kHostAllocHeader + sizeof(gs_sample_record), false, &Pipeline::on_host_alloc},
  };
  for (const auto& r : kRoutes)
    if (r.kind == kind) return &r;
  return nullptr;
}

Pipeline::Pipeline(store::EventSink& sink, StackMaps& stack_maps, std::function<attach::LostCounts()> bpf_lost,
                   symbolize::ProcessMaps& maps, const PipelineConfig& cfg)
    : sink_(sink), bpf_lost_(std::move(bpf_lost)), maps_(maps), cfg_(cfg), tracker_(cfg.complete_history),
      stacks_(sink, stack_maps, maps, build_ids_, cfg.recycle_stacks_at),
      kernel_names_(sink, maps, build_ids_, cfg.lazy_registration_names) {
  filling_.reserve(batch_capacity());
  // Each owner of per-process state on this thread lets go of it here, in the order of the
  // records: a process's exit comes after its last records.
  lifetime_.on_exit([this](uint32_t pid, uint64_t) {
    tracker_.forget_process(pid);
    maps_.forget(static_cast<pid_t>(pid));
    known_processes_.erase(pid);
    build_ids_.forget(pid);
    kernel_names_.forget(pid);
  });
  stacks_.subscribe(lifetime_);
  lifetime_.on_exit([this](uint32_t pid, uint64_t) { verbs_.forget(pid); });
  lifetime_.on_exec([this](uint32_t pid, uint64_t ts_ns) { maps_.forget_before(static_cast<pid_t>(pid), ts_ns); });
  if (!cfg.capture_path.empty()) {
    capture_ = std::fopen(cfg.capture_path.c_str(), "wbe");
    if (!capture_) throw Error("cannot write {}: {}", cfg.capture_path, strerror(errno));
    std::fwrite(kCaptureMagic, 1, sizeof(kCaptureMagic), capture_);
  }
}

Pipeline::~Pipeline() {
  if (thread_.joinable()) stop();
}

void Pipeline::push(const void* data, size_t size) {
  if (size < sizeof(uint16_t)) return;
  uint16_t kind;
  std::memcpy(&kind, data, sizeof(kind));
  const Route* route = route_of(kind);
  if (route && route->to_control && size >= route->min_size && control_record_) control_record_(kind, data);
  if (route && !route->handle) return;  // the control loop's alone
  const uint32_t len = static_cast<uint32_t>(size);
  // Appended, not resized and copied over: a resize zeroes the bytes first.
  const auto* len_bytes = reinterpret_cast<const uint8_t*>(&len);
  const auto* bytes = static_cast<const uint8_t*>(data);
  filling_.insert(filling_.end(), len_bytes, len_bytes + sizeof(len));
  filling_.insert(filling_.end(), bytes, bytes + size);
  ++filling_records_;
  if (filling_.size() >= cfg_.max_batch_bytes) end_batch();
}

size_t Pipeline::batch_capacity() const {
  // A batch ends once past max_batch_bytes: room for one more record of any kind (with its
  // length) means a buffer never grows.
  constexpr size_t kRoom = 64u << 10;
  static_assert(sizeof(uint32_t) + sizeof(gs_sample_stack_record) <= kRoom &&
                sizeof(uint32_t) + sizeof(gs_stack_copy_record) <= kRoom);
  return cfg_.max_batch_bytes + kRoom;
}

void Pipeline::end_batch() {
  if (filling_.empty()) return;
  if (capture_) capture(kChunkBatch, filling_.data(), filling_.size());
  {
    std::lock_guard lock(mu_);
    // The queue is bounded by the memory its buffers hold, not by what they contain: a flood
    // polled in many small batches would otherwise hold a buffer apiece. Small batches join the
    // last one still queued where it has room.
    if (!queue_.empty() && queue_.back().capacity() - queue_.back().size() >= filling_.size()) {
      queue_.back().insert(queue_.back().end(), filling_.begin(), filling_.end());
    } else if (queued_bytes_ + filling_.capacity() > cfg_.max_queued_bytes) {
      dropped_ += filling_records_;
    } else {
      queued_bytes_ += filling_.capacity();
      queue_.push_back(std::move(filling_));
      filling_ = std::vector<uint8_t>();
      // A buffer the pipeline is done with, rather than a new one for each batch.
      if (!spare_.empty()) {
        filling_ = std::move(spare_.back());
        spare_.pop_back();
      }
    }
  }
  cv_.notify_one();
  filling_.clear();
  if (filling_.capacity() < batch_capacity()) filling_.reserve(batch_capacity());
  filling_records_ = 0;
}

void Pipeline::add_library(store::LibraryRow row) {
  {
    std::lock_guard lock(mu_);
    libraries_.push_back(std::move(row));
  }
  cv_.notify_one();
}

void Pipeline::add_gpu_batch(gpu::NvmlSampler::Batch&& b) {
  {
    std::lock_guard lock(mu_);
    // Bounded like the record queue: a stalled writer drops GPU samples, not memory.
    if (gpu_batches_.size() < 10000) gpu_batches_.push_back(std::move(b));
  }
}

void Pipeline::add_pressure(std::vector<host::PressureReading>&& readings) {
  std::lock_guard lock(mu_);
  if (pressure_.size() < 100000) pressure_.insert(pressure_.end(), readings.begin(), readings.end());
}

void Pipeline::start() {
  last_commit_ns_ = monotonic_ns();
  thread_ = std::thread([this] {
    name_this_thread("gs-pipeline");
    run();
  });
}

void Pipeline::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  tracker_.flush([this](CallEvent& e) { emit(e); });
  write_lost();
  sink_.commit();
  if (capture_) {
    std::fclose(capture_);
    capture_ = nullptr;
  }
}

PipelineStats Pipeline::stats() const {
  return PipelineStats{records_.load(), calls_.load(),   launches_.load(),      samples_.load(),
                       dropped_.load(), stacks_.stats(), thread_times_.load(), heap_allocs_unrecorded_.load()};
}

void Pipeline::capture(uint32_t type, const void* data, size_t size) {
  std::lock_guard lock(capture_mu_);
  const uint32_t head[2] = {type, static_cast<uint32_t>(size)};
  std::fwrite(head, sizeof(head), 1, capture_);
  std::fwrite(data, 1, size, capture_);
}

void Pipeline::run() {
  for (;;) {
    std::deque<std::vector<uint8_t>> work;
    std::vector<store::LibraryRow> libraries;
    std::vector<gpu::NvmlSampler::Batch> gpu_batches;
    std::vector<host::PressureReading> pressure;
    bool done;
    uint64_t taken_ns;
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100),
                   [this] { return stopping_ || !queue_.empty() || !libraries_.empty(); });
      taken_ns = monotonic_ns();
      work.swap(queue_);
      libraries.swap(libraries_);
      gpu_batches.swap(gpu_batches_);
      pressure.swap(pressure_);
      queued_bytes_ = 0;
      done = stopping_;
    }
    try {
      for (const auto& lib : libraries) sink_.add_library(lib);
      for (const auto& b : gpu_batches) sink_.add_gpu_batch(b);
      for (const auto& r : pressure) sink_.add_pressure(r);
      for (const auto& batch : work) process_batch(batch);
      stacks_.recycle(taken_ns);
      maybe_commit();
    } catch (const std::exception& e) {
      // A store failure (disk full) must not take the recording down silently: say it once
      // per batch and keep consuming so the ring buffer never backs up into the targets.
      log_error("writing the record failed: {}", e.what());
    }
    {
      std::lock_guard lock(mu_);
      for (auto& batch : work) {
        if (spare_.size() >= kMaxSpareBatches || batch.capacity() != batch_capacity()) break;
        batch.clear();
        spare_.push_back(std::move(batch));
      }
    }
    if (done && work.empty()) {
      std::lock_guard lock(mu_);
      if (queue_.empty() && libraries_.empty() && gpu_batches_.empty() && pressure_.empty()) return;
    }
  }
}

void Pipeline::mark_complete_history(pid_t pid) {
  if (capture_) {
    const uint32_t p = static_cast<uint32_t>(pid);
    capture(kChunkCompleteHistory, &p, sizeof(p));
  }
  std::lock_guard lock(mu_);
  complete_history_marks_.push_back(static_cast<uint32_t>(pid));
}

void Pipeline::note_driver_probed(pid_t pid, uint64_t ts_ns) {
  if (capture_) {
    uint8_t b[12];
    const uint32_t p = static_cast<uint32_t>(pid);
    std::memcpy(b, &p, sizeof(p));
    std::memcpy(b + 4, &ts_ns, sizeof(ts_ns));
    capture(kChunkDriverProbed, b, sizeof(b));
  }
  std::lock_guard lock(mu_);
  driver_probed_marks_.emplace_back(static_cast<uint32_t>(pid), ts_ns);
}

void Pipeline::process_batch(const std::vector<uint8_t>& batch) {
  // Marked while the process was stopped at its library load, before its first call: applied
  // before any batch that can hold that call. A driver-probed mark may come a batch late: until
  // then the tracker takes no runtime call for one the driver does not see.
  std::vector<uint32_t> marks;
  std::vector<std::pair<uint32_t, uint64_t>> probed;
  {
    std::lock_guard lock(mu_);
    marks.swap(complete_history_marks_);
    probed.swap(driver_probed_marks_);
  }
  for (uint32_t pid : marks) tracker_.mark_complete_history(pid);
  for (auto [pid, ts_ns] : probed) tracker_.note_driver_probed(pid, ts_ns);
  stacks_.begin_batch();
  size_t at = 0;
  while (at + sizeof(uint32_t) <= batch.size()) {
    uint32_t len;
    std::memcpy(&len, batch.data() + at, sizeof(len));
    at += sizeof(len);
    if (len > batch.size() - at) break;  // a damaged capture: never read past the batch
    process_record(batch.data() + at, len);
    at += len;
  }
  if (auto redundant = tracker_.take_redundant_runtime_functions(); !redundant.empty()) {
    std::lock_guard lock(mu_);
    redundant_runtime_.insert(redundant_runtime_.end(), redundant.begin(), redundant.end());
  }
}

std::vector<uint16_t> Pipeline::take_redundant_runtime_functions() {
  std::lock_guard lock(mu_);
  std::vector<uint16_t> out;
  out.swap(redundant_runtime_);
  return out;
}

void Pipeline::process_record(const uint8_t* data, size_t size) {
  ++records_;
  if (size < sizeof(uint16_t)) return;
  uint16_t kind;
  std::memcpy(&kind, data, sizeof(kind));
  const Route* route = route_of(kind);
  if (!route || !route->handle || size < route->min_size) return;
  (this->*route->handle)(data, size);
}

// Records sit at 4 mod 8 in a batch: each is copied out (aligned) before its fields are read.

void Pipeline::on_call(const uint8_t* data, size_t size) {
  gs_call_record rec;
  std::memcpy(&rec, data, sizeof(rec));
  stacks_.note_time(rec.ts_ns);
  if (cuda::handoff_by_id(rec.func)) {
    stacks_.on_handoff(rec);
    return;
  }
  CallEvent e;
  // A longer record carries the rest of a 3-D copy's descriptor after the call record.
  const std::span<const uint8_t> more(data + sizeof(rec), size >= sizeof(gs_call_record_long)
                                                              ? sizeof(gs_call_record_long) - sizeof(rec)
                                                              : 0);
  if (!decode::decode_call(rec, e, more)) return;
  e.stack_id = stacks_.call_stack(rec, e.py_stack);
  if (rec.flags & GS_CALL_STACK_SAMPLED_OUT) e.stack_weight = 0;
  else if (rec.flags & GS_CALL_STACK_SAMPLED) e.stack_weight = std::max<uint32_t>(rec.stack_weight, 1);
  kernel_names_.name_call(e);
  tracker_.process(std::move(e), [this](CallEvent& ev) { emit(ev); });
}

void Pipeline::on_stack_copy(const uint8_t* data, size_t size) {
  uint32_t pid;
  uint64_t ts;
  std::memcpy(&pid, data + offsetof(gs_stack_copy_record, pid), sizeof(pid));
  std::memcpy(&ts, data + offsetof(gs_stack_copy_record, ts_ns), sizeof(ts));
  note_process(pid, ts);  // its maps are read before the copy is unwound
  stacks_.on_stack_copy(data, size);
}

void Pipeline::on_python_code(const uint8_t* data, size_t) {
  gs_py_code_record code;
  std::memcpy(&code, data, sizeof(code));
  stacks_.on_python_code(code);
}

void Pipeline::on_python_stack(const uint8_t* data, size_t size) { stacks_.on_python_stack(data, size); }

void Pipeline::on_native_stack(const uint8_t* data, size_t size) { stacks_.on_native_stack(data, size); }

void Pipeline::on_fork(const uint8_t* data, size_t) {
  gs_proc_record rec;
  std::memcpy(&rec, data, sizeof(rec));
  stacks_.on_fork(rec.ppid, rec.pid);
}

void Pipeline::on_sample(const uint8_t* data, size_t size) {
  gs_sample_record rec;
  std::memcpy(&rec, data, sizeof(rec));
  stacks_.note_time(rec.ts_ns);
  note_process(rec.pid, rec.ts_ns);
  note_thread(rec.tid, rec.pid, std::string(rec.comm, strnlen(rec.comm, sizeof(rec.comm))));
  const auto st = stacks_.sample_stacks(rec, data, size);
  sink_.add_sample(rec.ts_ns, rec.pid, rec.tid, rec.cpu, st.user, st.kernel);
  ++samples_;
  ++calls_since_commit_;
}

void Pipeline::on_host_alloc(const uint8_t* data, size_t size) {
  gs_host_alloc_record rec;
  std::memcpy(&rec, data, kHostAllocHeader + sizeof(gs_sample_record));
  const auto& s = rec.stack.s;
  stacks_.note_time(s.ts_ns);
  note_process(s.pid, s.ts_ns);
  store::HostAllocRow row;
  row.ts_ns = s.ts_ns;
  row.pid = s.pid;
  row.tid = s.tid;
  row.addr = rec.addr;
  row.length = rec.length;
  switch (rec.op) {
    case GS_HOST_MMAP:
      row.op = "mmap";
      // The stack copy (when it came) is read in place, as a sample's.
      row.stack_id = stacks_.sample_stacks(s, data + kHostAllocHeader, size - kHostAllocHeader).user;
      break;
    case GS_HOST_MUNMAP:
      row.op = "munmap";
      break;
    case GS_HOST_MREMAP:
      row.op = "mremap";
      row.old_addr = rec.old_addr;
      break;
    case GS_HOST_MALLOC:
      heap_allocs_unrecorded_ += rec.unrecorded;
      if (!rec.addr) return;  // the count alone, at the process's exit
      row.op = "malloc";
      row.stack_id = stacks_.sample_stacks(s, data + kHostAllocHeader, size - kHostAllocHeader).user;
      break;
    case GS_HOST_FREE:
      row.op = "free";
      break;
    default:
      return;
  }
  sink_.add_host_alloc(row);
  ++calls_since_commit_;
}

void Pipeline::on_function_name(const uint8_t* data, size_t size) {
  gs_function_name_record r;
  std::memcpy(&r, data, sizeof(r));
  const size_t length = std::min<size_t>(r.length, size - sizeof(r));
  tracker_.learn_function_name(r.pid, r.function, std::string(reinterpret_cast<const char*>(data) + sizeof(r), length));
}

void Pipeline::on_verbs(const uint8_t* data, size_t size) {
  RdmaEvent e;
  if (!decode::decode_verbs(data, size, e)) return;
  note_process(e.pid, e.ts_ns);
  verbs_.process(e);
  sink_.add_rdma(e);
}

void Pipeline::on_thread_time(const uint8_t* data, size_t) {
  gs_thread_time_record r;
  std::memcpy(&r, data, sizeof(r));
  auto text = [](const char* s) { return std::string(s, strnlen(s, GS_COMM_LEN)); };
  // Threads that make no CUDA call (a DataLoader worker) are named here; not from a thread's last
  // window, which may come after its process's exit record: a process gone is not noted again
  // (it would be read from /proc no more, and kept as known for ever).
  if (!(r.flags & GS_TT_EXITED)) note_process(r.pid, r.start_ns);
  if (known_processes_.contains(r.pid)) note_thread(r.tid, r.pid, text(r.comm));
  store::ThreadTimeRow row;
  row.pid = r.pid;
  row.tid = r.tid;
  row.start_ns = r.start_ns;
  row.end_ns = r.end_ns;
  row.on_cpu_ns = r.ns[GS_TS_ON_CPU];
  row.runnable_ns = r.ns[GS_TS_RUNNABLE];
  row.io_ns = r.ns[GS_TS_BLOCKED_IO];
  row.lock_ns = r.ns[GS_TS_BLOCKED_LOCK];
  row.fd_ns = r.ns[GS_TS_BLOCKED_FD];
  row.sleep_ns = r.ns[GS_TS_BLOCKED_SLEEP];
  row.other_ns = r.ns[GS_TS_BLOCKED_OTHER];
  row.waited_ns = r.waited_ns;
  row.waited_for_tid = r.waited_for_tid;
  row.waited_for_pid = r.waited_for_pid;
  row.waited_for_comm = text(r.waited_for_comm);
  row.waited_for_kthread = r.flags & GS_TT_WAITED_FOR_KTHREAD;
  row.blocked_ns = r.blocked_ns;
  row.waker_tid = r.waker_tid;
  row.waker_pid = r.waker_pid;
  row.waker_comm = text(r.waker_comm);
  row.switches = r.switches;
  row.preempted = r.preempted;
  row.faults = r.faults;
  row.reclaim_ns = r.reclaim_ns;
  row.net_softirq_ns = uint64_t(r.net_softirq_us) * 1000;
  row.sys_ns = r.sys_ns;
  // What its longest blocked stretch waited in, and on which file or socket (named now: the
  // descriptor is most likely still what it was).
  if (r.blocked_ns && r.blocked_syscall >= 0) {
    row.blocked_syscall = discover::syscall_name(r.blocked_syscall);
    if (r.blocked_fd >= 0) row.blocked_on = fd_names_.name(pid_t(r.pid), r.blocked_fd);
  }
  static constexpr const char* kStates[GS_TS_NR] = {"on_cpu", "runnable", "io", "lock", "fd", "sleep", "other"};
  row.state = (r.flags & GS_TT_EXITED) ? "exited" : r.state < GS_TS_NR ? kStates[r.state] : "other";
  sink_.add_thread_time(row);
  ++thread_times_;
}

void Pipeline::on_exit(const uint8_t* data, size_t) {
  gs_proc_record rec;
  std::memcpy(&rec, data, sizeof(rec));
  // Its own held calls only: other processes' threads may be between a runtime launch's
  // record and its driver launch's (tracker.h).
  tracker_.flush_process(rec.pid, [this](CallEvent& ev) { emit(ev); });
  if (known_processes_.count(rec.pid)) {
    // exit_code is the kernel's wait status: code in bits 8..15, or the signal.
    const int status = rec.exit_code;
    sink_.set_process_exit(rec.pid, rec.ts_ns, (status & 0x7f) ? -(status & 0x7f) : (status >> 8) & 0xff);
  }
  lifetime_.exited(rec.pid, rec.ts_ns);
}

void Pipeline::on_exec(const uint8_t* data, size_t) {
  gs_proc_record rec;
  std::memcpy(&rec, data, sizeof(rec));
  lifetime_.executed(rec.pid, rec.ts_ns);
  const bool known = known_processes_.erase(rec.pid) > 0;
  // The record names the new program: a short one may be gone by now, and its name read
  // before the exec ("gpuscope", for the command record starts) would stay.
  if (known || cfg_.note_every_exec)
    note_process(rec.pid, rec.ts_ns, std::string(rec.comm, strnlen(rec.comm, sizeof(rec.comm))));
}

void Pipeline::note_process(uint32_t pid, uint64_t ts_ns, const std::string& comm_seen) {
  if (!known_processes_.insert(pid).second) return;
  maps_.refresh(pid);
  std::string comm = discover::read_comm(pid);
  if (comm.empty()) comm = comm_seen;
  sink_.upsert_process(pid, discover::read_ppid(pid), comm, discover::read_cmdline(pid), discover::read_exe(pid),
                       ts_ns);
}

void Pipeline::emit(CallEvent& e) {
  note_process(e.pid, e.ts_ns);
  note_thread(e.tid, e.pid, e.comm);
  e.stack_id = stacks_.finish_call_stack(e.pid, e.tid, e.stack_id, e.py_stack);
  const auto* f = cuda::function_by_id(e.func);
  if (f && f->kind == cuda::CallKind::Launch) {
    e.kernel_id = kernel_names_.kernel_id(e, tracker_);
    if (!e.parent_id) ++launches_;
  }
  sink_.add_call(e);
  ++calls_;
  ++calls_since_commit_;
}

void Pipeline::note_thread(uint32_t tid, uint32_t pid, const std::string& comm) {
  // Bounded on a host where threads come and go for weeks: forgetting only costs telling the
  // sink a thread's name again.
  if (thread_comms_.size() >= kMaxThreadComms) thread_comms_.clear();
  auto& known = thread_comms_[tid];
  if (known == comm) return;
  known = comm;
  sink_.upsert_thread(tid, pid, comm);
}

void Pipeline::write_lost() {
  const auto lost = bpf_lost_ ? bpf_lost_() : attach::LostCounts{};
  for (int cause = 0; cause < GS_LOST_NR; ++cause) sink_.set_lost(std::string(attach::lost_cause_name(cause)), lost[cause]);
  sink_.set_lost("queue_full", dropped_.load());
  sink_.set_lost("name_unreadable", kernel_names_.unread());
  for (const auto& [cause, n] : stacks_.lost()) sink_.set_lost(cause, n);
}

void Pipeline::maybe_commit() {
  const uint64_t now = monotonic_ns();
  if (calls_since_commit_ < cfg_.commit_every_calls && now - last_commit_ns_ < cfg_.commit_interval_ns) return;
  write_lost();
  sink_.commit();
  calls_since_commit_ = 0;
  last_commit_ns_ = now;
}

void replay_capture(const std::string& path, Pipeline& pipeline) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read {}", path);
  char magic[sizeof(kCaptureMagic)] = {};
  if (!in.read(magic, sizeof(magic)) || std::memcmp(magic, kCaptureMagic, sizeof(magic)) != 0)
    throw Error("{} is not a capture of ring-buffer records (written by record --capture-records)", path);
  std::vector<uint8_t> chunk;
  for (uint32_t head[2]; in.read(reinterpret_cast<char*>(head), sizeof(head));) {
    if (head[1] > (256u << 20)) throw Error("{}: a chunk of {} bytes: the file is damaged", path, head[1]);
    chunk.resize(head[1]);
    if (!in.read(reinterpret_cast<char*>(chunk.data()), head[1])) throw Error("{}: cut short", path);
    switch (head[0]) {
      case kChunkBatch:
        for (size_t at = 0; at + sizeof(uint32_t) <= chunk.size();) {
          uint32_t len;
          std::memcpy(&len, chunk.data() + at, sizeof(len));
          at += sizeof(len);
          if (len > chunk.size() - at) throw Error("{}: a record runs past its batch: the file is damaged", path);
          pipeline.push(chunk.data() + at, len);
          at += len;
        }
        pipeline.end_batch();
        break;
      case kChunkCompleteHistory:
        if (chunk.size() >= 4) {
          uint32_t pid;
          std::memcpy(&pid, chunk.data(), sizeof(pid));
          pipeline.mark_complete_history(static_cast<pid_t>(pid));
        }
        break;
      case kChunkDriverProbed:
        if (chunk.size() >= 12) {
          uint32_t pid;
          uint64_t ts;
          std::memcpy(&pid, chunk.data(), sizeof(pid));
          std::memcpy(&ts, chunk.data() + 4, sizeof(ts));
          pipeline.note_driver_probed(static_cast<pid_t>(pid), ts);
        }
        break;
      default:
        break;  // a later kind of chunk
    }
  }
}

}  // namespace gpuscope::record
