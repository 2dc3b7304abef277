#include "record/pipeline.h"

#include <sys/uio.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>

#include "common/clock.h"
#include "common/log.h"
#include "decode/decoder.h"
#include "cuda/handoffs.h"
#include "discover/proc.h"
#include "elf/elf_file.h"

namespace gpuscope::record {

Pipeline::Pipeline(store::EventSink& sink, attach::BpfSession& bpf, symbolize::ProcessMaps& maps,
                   const PipelineConfig& cfg)
    : sink_(sink), bpf_(bpf), maps_(maps), cfg_(cfg), tracker_(cfg.complete_history), unwinder_(maps),
      stack_gens_(cfg.recycle_stacks_at, bpf.stack_map_entries()),
      stitcher_([this](const Stitcher::Frames& f) { return f.empty() ? 0 : sink_.intern_stack(f); },
                [this](uint16_t handoff) { return handoff_separator(handoff); },
                [this] { return truncated_frame(); }) {
  filling_.reserve(batch_capacity());
}

Pipeline::~Pipeline() {
  if (thread_.joinable()) stop();
}

void Pipeline::push(const void* data, size_t size) {
  const uint32_t len = static_cast<uint32_t>(size);
  const size_t at = filling_.size();
  filling_.resize(at + sizeof(len) + size);
  std::memcpy(filling_.data() + at, &len, sizeof(len));
  std::memcpy(filling_.data() + at + sizeof(len), data, size);
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

void Pipeline::add_handoff_workers(const std::string& build_id, const std::string& path, std::vector<WorkerRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const WorkerRange& a, const WorkerRange& b) { return a.start < b.start; });
  std::lock_guard lock(mu_);
  new_worker_ranges_.emplace_back(worker_file_key(build_id, path), std::move(ranges));
}

std::string Pipeline::worker_file_key(const std::string& build_id, const std::string& path) {
  return build_id.empty() ? "path:" + path : build_id;
}

void Pipeline::add_gpu_batch(gpu::NvmlSampler::Batch&& b) {
  {
    std::lock_guard lock(mu_);
    // Bounded like the record queue: a stalled writer drops GPU samples, not memory.
    if (gpu_batches_.size() < 10000) gpu_batches_.push_back(std::move(b));
  }
}

void Pipeline::start() {
  last_commit_ns_ = monotonic_ns();
  thread_ = std::thread([this] { run(); });
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
}

PipelineStats Pipeline::stats() const {
  return PipelineStats{records_.load(),        calls_.load(),   launches_.load(),
                       samples_.load(),        dropped_.load(), stack_recycles_.load(),
                       stacks_expired_.load(), python_generations_.load(),
                       handoffs_.load(),       stitched_.load(),
                       copy_holes_read_.load(), copy_holes_zeroed_.load()};
}

void Pipeline::run() {
  for (;;) {
    std::deque<std::vector<uint8_t>> work;
    std::vector<store::LibraryRow> libraries;
    std::vector<gpu::NvmlSampler::Batch> gpu_batches;
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
      queued_bytes_ = 0;
      done = stopping_;
    }
    try {
      for (const auto& lib : libraries) sink_.add_library(lib);
      for (const auto& b : gpu_batches) sink_.add_gpu_batch(b);
      for (const auto& batch : work) process_batch(batch);
      recycle_stacks(taken_ns);
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
      if (queue_.empty() && libraries_.empty() && gpu_batches_.empty()) return;
    }
  }
}

void Pipeline::mark_complete_history(pid_t pid) {
  std::lock_guard lock(mu_);
  complete_history_marks_.push_back(static_cast<uint32_t>(pid));
}

void Pipeline::note_driver_probed(pid_t pid, uint64_t ts_ns) {
  std::lock_guard lock(mu_);
  driver_probed_marks_.emplace_back(static_cast<uint32_t>(pid), ts_ns);
}

void Pipeline::process_batch(const std::vector<uint8_t>& batch) {
  // Marked while the process was stopped at its library load, before its first call: applied
  // before any batch that can hold that call. A driver-probed mark may come a batch late: until
  // then the tracker takes no runtime call for one the driver does not see.
  std::vector<uint32_t> marks;
  std::vector<std::pair<uint32_t, uint64_t>> probed;
  std::vector<std::pair<std::string, std::vector<WorkerRange>>> ranges;
  {
    std::lock_guard lock(mu_);
    marks.swap(complete_history_marks_);
    probed.swap(driver_probed_marks_);
    ranges.swap(new_worker_ranges_);
  }
  for (uint32_t pid : marks) tracker_.mark_complete_history(pid);
  for (auto [pid, ts_ns] : probed) tracker_.note_driver_probed(pid, ts_ns);
  if (!ranges.empty()) {
    for (auto& [file, r] : ranges) {
      for (const auto& w : r)
        if (std::find(handoffs_probed_.begin(), handoffs_probed_.end(), w.handoff) == handoffs_probed_.end())
          handoffs_probed_.push_back(w.handoff);
      worker_ranges_[file] = std::move(r);
    }
    // Frames resolved before did not look for them, nor did the stacks stored from them.
    frame_cache_.clear();
    forget_stored_stacks();
  }
  if (const uint64_t epoch = sink_.stack_epoch(); epoch != stack_epoch_) {
    stack_epoch_ = epoch;
    forget_stored_stacks();
    kernel_stack_ids_.clear();
    py_frame_ids_.clear();
    stitcher_.forget_stacks();
  }
  size_t at = 0;
  while (at + sizeof(uint32_t) <= batch.size()) {
    uint32_t len;
    std::memcpy(&len, batch.data() + at, sizeof(len));
    at += sizeof(len);
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
  uint16_t kind;
  std::memcpy(&kind, data, sizeof(kind));
  switch (kind) {
    case GS_REC_CALL: {
      if (size < sizeof(gs_call_record)) return;
      gs_call_record rec;
      std::memcpy(&rec, data, sizeof(rec));
      newest_ts_ns_ = std::max<uint64_t>(newest_ts_ns_, rec.ts_ns);
      if (cuda::handoff_by_id(rec.func)) {
        on_handoff(rec);
        break;
      }
      CallEvent e;
      // A longer record carries the rest of a 3-D copy's descriptor after the call record.
      const std::span<const uint8_t> more(data + sizeof(rec), size >= sizeof(gs_call_record_long)
                                                                  ? sizeof(gs_call_record_long) - sizeof(rec)
                                                                  : 0);
      if (!decode::decode_call(rec, e, more)) return;
      const uint16_t thread_handoff = handoff_thread(rec.comm, sizeof(rec.comm));
      if (rec.flags & GS_CALL_STACK_COPIED)
        e.stack_id = take_sent_stack(rec.pid, rec.tid, rec.ts_ns, e.py_stack, thread_handoff);
      if (rec.native_stack) e.stack_id = native_stack(rec.pid, rec.native_stack, e.py_stack, thread_handoff);
      if (rec.flags & GS_CALL_STACK_SAMPLED_OUT) e.stack_weight = 0;
      else if (rec.flags & GS_CALL_STACK_SAMPLED) e.stack_weight = std::max<uint32_t>(rec.stack_weight, 1);
      if (e.name_addr && cfg_.lazy_registration_names && is_registration(e)) {
        e.name.clear();  // the Tracker keeps name_addr, read at the kernel's first launch
      } else if (e.name_addr) {
        e.name = read_name(e.pid, e.name_addr, e.name);
        if (e.name.empty()) ++names_unread_;
      }
      tracker_.process(std::move(e), [this](CallEvent& ev) { emit(ev); });
      break;
    }
    case GS_REC_STACK_COPY: {
      // Unwound now, while the process's mappings are as they were at the call; the call's
      // record follows (at the call's return, for calls with one).
      if (size < sizeof(gs_stack_copy_record)) return;
      // Records sit at 4 mod 8 in a batch: fields are copied out, never read in place.
      using R = gs_stack_copy_record;
      uint32_t pid, tid, len;
      uint16_t holes;
      uint64_t ts;
      std::memcpy(&holes, data + offsetof(R, holes), sizeof(holes));
      std::memcpy(&pid, data + offsetof(R, pid), sizeof(pid));
      std::memcpy(&tid, data + offsetof(R, tid), sizeof(tid));
      std::memcpy(&len, data + offsetof(R, stack_len), sizeof(len));
      std::memcpy(&ts, data + offsetof(R, ts_ns), sizeof(ts));
      note_process(pid, ts);
      // Bounded: a copy whose call record was lost must not stay forever.
      if (copied_stacks_.size() >= kMaxCopiedStacks) copied_stacks_.clear();
      auto& unwound = copied_stacks_[{tid, ts}] = unwind_stack_copy(pid, tid, data + offsetof(R, regs), data + offsetof(R, data), len, holes);
      if (copy_unwound_) copy_unwound_(pid, unwound.ips);
      break;
    }
    case GS_REC_PY_CODE: {
      if (size < sizeof(gs_py_code_record)) return;
      gs_py_code_record code;  // aligned: the record sits at 4 mod 8 in its batch
      std::memcpy(&code, data, sizeof(code));
      python_.on_code(code);
      break;
    }
    case GS_REC_PY_STACK:
      // A new generation drops the one before the current: calls recorded before the BPF side
      // forgot the stacks sent (at the last switch) may name its stacks, and they can still be in
      // the queue when this pipeline lags behind (it unwinds stack copies): wait until it has
      // passed that moment, holding more stacks meanwhile.
      if (python_.stacks_held() >= kMaxPythonStacks && newest_ts_ns_ >= python_forgotten_ns_) {
        bpf_.forget_python_stacks();
        python_forgotten_ns_ = monotonic_ns();
        python_.new_generation();
        ++python_generations_;
      }
      python_.on_stack(data, size);
      break;
    case GS_REC_NATIVE_STACK:
      on_native_stack(data, size);
      break;
    case GS_REC_FORK: {  // sent for forks of Python processes
      gs_proc_record rec;
      std::memcpy(&rec, data, std::min(size, sizeof(rec)));
      python_.on_fork(static_cast<pid_t>(rec.ppid), static_cast<pid_t>(rec.pid));
      break;
    }
    case GS_REC_SAMPLE: {
      if (size < sizeof(gs_sample_record)) return;
      gs_sample_record rec;
      std::memcpy(&rec, data, sizeof(rec));
      newest_ts_ns_ = std::max<uint64_t>(newest_ts_ns_, rec.ts_ns);
      note_process(rec.pid, rec.ts_ns);
      note_thread(rec.tid, rec.pid, std::string(rec.comm, strnlen(rec.comm, sizeof(rec.comm))));
      int64_t user_stack = 0;
      const uint16_t thread_handoff = handoff_thread(rec.comm, sizeof(rec.comm));
      if (size >= sizeof(gs_sample_stack_record)) {
        // The stack copy is read in place: it is most of the record.
        using R = gs_sample_stack_record;
        uint32_t len;
        uint16_t holes;
        std::memcpy(&len, data + offsetof(R, stack_len), sizeof(len));
        std::memcpy(&holes, data + offsetof(R, holes), sizeof(holes));
        const auto u =
            unwind_stack_copy(rec.pid, rec.tid, data + offsetof(R, regs), data + offsetof(R, data), len, holes);
        user_stack = store_user_stack(rec.pid, u.ips, u.truncated, rec.py_stack, thread_handoff);
      } else if (rec.native_stack) {
        user_stack = native_stack(rec.pid, rec.native_stack, rec.py_stack, thread_handoff);
      } else {
        user_stack = python_only_stack(rec.pid, rec.py_stack);
      }
      user_stack = stitcher_.stitch(rec.pid, rec.tid, user_stack);
      sink_.add_sample(rec.ts_ns, rec.pid, rec.tid, rec.cpu, user_stack, resolve_kernel_stack(rec.kstack_id, rec.ts_ns));
      ++samples_;
      ++calls_since_commit_;
      break;
    }
    case GS_REC_EXIT: {
      gs_proc_record rec;
      std::memcpy(&rec, data, std::min(size, sizeof(rec)));
      // Its own held calls only: other processes' threads may be between a runtime launch's
      // record and its driver launch's (tracker.h).
      tracker_.flush_process(rec.pid, [this](CallEvent& ev) { emit(ev); });
      if (known_processes_.count(rec.pid)) {
        // exit_code is the kernel's wait status: code in bits 8..15, or the signal.
        const int status = rec.exit_code;
        sink_.set_process_exit(rec.pid, rec.ts_ns, (status & 0x7f) ? -(status & 0x7f) : (status >> 8) & 0xff);
      }
      tracker_.forget_process(rec.pid);
      stitcher_.forget_process(rec.pid);
      maps_.forget(rec.pid);
      known_processes_.erase(rec.pid);
      stack_ids_.erase(rec.pid);
      sent_stack_ids_.erase(rec.pid);
      build_ids_.erase(rec.pid);
      kernel_ids_.erase(rec.pid);
      frame_cache_.erase(rec.pid);
      unwinder_.forget(static_cast<pid_t>(rec.pid));
      python_.forget(static_cast<pid_t>(rec.pid));
      forget_native_stacks(rec.pid);  // a later process with this pid walks other code
      break;
    }
    case GS_REC_EXEC: {
      gs_proc_record rec;
      std::memcpy(&rec, data, std::min(size, sizeof(rec)));
      maps_.forget_before(rec.pid, rec.ts_ns);
      unwinder_.forget(static_cast<pid_t>(rec.pid));
      // The same addresses are other code in the new program.
      frame_cache_.erase(rec.pid);
      stack_ids_.erase(rec.pid);
      sent_stack_ids_.erase(rec.pid);
      forget_native_stacks(rec.pid);
      const bool known = known_processes_.erase(rec.pid) > 0;
      // The record names the new program: a short one may be gone by now, and its name read
      // before the exec ("gpuscope", for the command record starts) would stay.
      if (known || cfg_.note_every_exec)
        note_process(rec.pid, rec.ts_ns, std::string(rec.comm, strnlen(rec.comm, sizeof(rec.comm))));
      break;
    }
    default:
      break;
  }
}

bool Pipeline::is_registration(const CallEvent& e) {
  const auto* f = cuda::function_by_id(e.func);
  return f && f->sig == cuda::Signature::RegisterFunction;
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
  if (!e.stack_id) e.stack_id = python_only_stack(e.pid, e.py_stack);
  e.stack_id = stitcher_.stitch(e.pid, e.tid, e.stack_id);
  const auto* f = cuda::function_by_id(e.func);
  if (f && f->kind == cuda::CallKind::Launch) {
    e.kernel_id = resolve_kernel(e);
    if (!e.parent_id) ++launches_;
  }
  sink_.add_call(e);
  ++calls_;
  ++calls_since_commit_;
}

const std::string& Pipeline::build_id_of(uint32_t pid, const symbolize::ModuleAddress& m) {
  auto& ids = build_ids_[pid];
  auto it = ids.find(m.open_path);
  // Asked again, not m.open_path: ProcessMaps reuses its answer for a while, so a process that
  // has just exited may still be given its root's path.
  if (it == ids.end()) it = ids.emplace(m.open_path, elf::read_build_id(symbolize::openable_path(pid, m.path))).first;
  return it->second;
}

std::string Pipeline::read_name(uint32_t pid, uint64_t addr, const std::string& partial) {
  char buf[4096] = {};
  iovec local{buf, sizeof(buf) - 1}, remote{reinterpret_cast<void*>(addr), sizeof(buf) - 1};
  // Names in read-only data may sit at the end of a mapping; a short read is fine.
  if (process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) <= 0) {
    // The process is gone: the name is in its file, where the mapping says.
    auto m = maps_.resolve(pid, addr);
    if (!m) return partial;
    std::ifstream in(symbolize::openable_path(pid, m->path), std::ios::binary);  // as in build_id_of
    in.seekg(static_cast<std::streamoff>(m->file_offset));
    in.read(buf, sizeof(buf) - 1);
  }
  std::string name(buf, strnlen(buf, sizeof(buf)));
  return name.size() >= partial.size() ? name : partial;
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

int64_t Pipeline::resolve_kernel_stack(int32_t bpf_stack_id, uint64_t ts_ns) {
  if (bpf_stack_id < 0 || stack_expired(bpf_stack_id, ts_ns)) return 0;
  if (auto it = kernel_stack_ids_.find(bpf_stack_id); it != kernel_stack_ids_.end()) return it->second;
  stack_gens_.seen(bpf_stack_id);
  if (!kallsyms_) {
    kallsyms_ = std::make_unique<symbolize::Kallsyms>();
    utsname u{};
    uname(&u);
    kernel_module_id_ = sink_.intern_module("[kernel]", u.release);
  }
  std::vector<store::StoredFrame> frames;
  for (uint64_t ip : bpf_.stack(bpf_stack_id)) {
    frames.push_back({kernel_module_id_, ip, ip});
    if (named_kernel_ips_.insert(ip).second) {
      const std::string name = kallsyms_->resolve(ip);
      if (!name.empty()) sink_.add_symbol(kernel_module_id_, ip, name);
    }
  }
  const int64_t id = frames.empty() ? 0 : sink_.intern_stack(frames);
  kernel_stack_ids_.emplace(bpf_stack_id, id);
  return id;
}

int64_t Pipeline::python_only_stack(uint32_t pid, uint64_t py_stack) {
  if (!py_stack) return 0;
  auto& ids = stack_ids_[pid];
  if (auto it = ids.find(py_stack); it != ids.end()) return it->second;
  if (ids.size() >= kMaxPythonStacks) ids.clear();
  const int64_t id = store_user_stack(pid, {}, false, py_stack);
  ids.emplace(py_stack, id);
  return id;
}

int64_t Pipeline::take_sent_stack(uint32_t pid, uint32_t tid, uint64_t ts_ns, uint64_t py_stack,
                                  uint16_t thread_handoff) {
  auto it = copied_stacks_.find({tid, ts_ns});
  if (it == copied_stacks_.end()) return 0;
  const Unwound& u = it->second;
  // The same frames come again and again (a hot call, copied at each call): the stack is
  // stored once per process and found again by its frames.
  std::string key(reinterpret_cast<const char*>(u.ips.data()), u.ips.size() * sizeof(uint64_t));
  key.append(reinterpret_cast<const char*>(&py_stack), sizeof(py_stack));
  key.push_back(u.truncated ? 1 : 0);
  auto& ids = sent_stack_ids_[pid];
  int64_t id;
  if (auto known = ids.find(key); known != ids.end()) {
    id = known->second;
  } else {
    if (ids.size() >= kMaxSentStacksPerProcess) ids.clear();
    id = store_user_stack(pid, u.ips, u.truncated, py_stack, thread_handoff);
    ids.emplace(std::move(key), id);
  }
  copied_stacks_.erase(it);
  return id;
}

void Pipeline::on_native_stack(const uint8_t* data, size_t size) {
  constexpr size_t header = offsetof(gs_native_stack_record, ips);
  if (size < header) return;
  gs_native_stack_record rec;
  std::memcpy(&rec, data, header);
  const size_t nr = std::min<size_t>({rec.nr, GS_MAX_NATIVE_DEPTH, (size - header) / sizeof(uint64_t)});
  Unwound u;
  u.ips.resize(nr);
  std::memcpy(u.ips.data(), data + header, nr * sizeof(uint64_t));
  u.truncated = !(rec.flags & (GS_NATIVE_COMPLETE | GS_NATIVE_FP_END));
  if (rec.flags & GS_NATIVE_ONCE) {
    // Bounded: a stack whose record was lost must not stay.
    if (once_stacks_.size() >= kMaxOnceStacks) once_stacks_.clear();
    once_stacks_[rec.id] = std::move(u);
    return;
  }
  if (native_stacks_[rec.pid].stacks.size() >= kMaxNativeStacksPerProcess) forget_native_stacks(rec.pid);
  native_stacks_[rec.pid].stacks[rec.id] = std::move(u);
}

int64_t Pipeline::native_stack(uint32_t pid, uint64_t id, uint64_t py_stack, uint16_t thread_handoff) {
  if (auto once = once_stacks_.find(id); once != once_stacks_.end()) {
    auto& cache = native_stacks_[pid].once_stored;
    int64_t stored;
    if (auto it = cache.find({id, py_stack}); it != cache.end()) {
      stored = it->second;
    } else {
      stored = store_user_stack(pid, once->second.ips, once->second.truncated, py_stack, thread_handoff);
      if (cache.size() >= kMaxOnceStoredPerProcess) cache.clear();
      cache.emplace(std::pair{id, py_stack}, stored);
    }
    once_stacks_.erase(once);
    return stored;
  }
  auto p = native_stacks_.find(pid);
  if (p == native_stacks_.end()) {
    ++native_stacks_unknown_;
    return 0;
  }
  auto& n = p->second;
  if (auto it = n.stored.find({id, py_stack}); it != n.stored.end()) return it->second;
  auto it = n.stacks.find(id);
  if (it == n.stacks.end()) {
    ++native_stacks_unknown_;
    return 0;
  }
  const int64_t stored = store_user_stack(pid, it->second.ips, it->second.truncated, py_stack, thread_handoff);
  n.stored.emplace(std::pair{id, py_stack}, stored);
  return stored;
}

void Pipeline::forget_native_stacks(uint32_t pid) {
  auto it = native_stacks_.find(pid);
  if (it == native_stacks_.end()) return;
  std::vector<uint64_t> ids;
  ids.reserve(it->second.stacks.size());
  for (const auto& [id, u] : it->second.stacks) ids.push_back(id);
  bpf_.forget_native_stacks(ids);
  native_stacks_.erase(it);
}

bool Pipeline::stack_expired(int32_t bpf_stack_id, uint64_t ts_ns) {
  // A sample taken before the flip and read after the emptying loses its kernel stack so; none
  // gets another's.
  if (!stack_gens_.expired(bpf_stack_id, ts_ns)) return false;
  ++stacks_expired_;
  return true;
}

// The kernel never frees a stack map's entries, and new kernel stacks keep coming to an agent that
// samples for weeks (user stacks are walked in BPF and need no map). Once the map is full, every
// new stack would be lost. So captures go to one of
// two maps, and when it is full enough (StackGenerations::next), to the other; the first is
// emptied once every record captured before the switch has been processed.
void Pipeline::recycle_stacks(uint64_t taken_ns) {
  switch (stack_gens_.next(taken_ns)) {
    case StackGenerations::Step::None:
      return;
    case StackGenerations::Step::Flip:
      stack_gens_.flipped(bpf_.flip_stack_generation(), monotonic_ns());
      return;
    case StackGenerations::Step::Empty:
      break;
  }
  const int old = stack_gens_.current() ^ 1;
  auto in_old = [old](int32_t id) { return id >= 0 && StackGenerations::generation_of(id) == old; };
  std::erase_if(kernel_stack_ids_, [&](const auto& kv) { return in_old(kv.first); });
  bpf_.clear_stacks(old);
  stack_gens_.emptied(monotonic_ns());
  ++stack_recycles_;
}

Pipeline::Unwound Pipeline::unwind_stack_copy(uint32_t pid, uint32_t tid, const uint8_t* regs_in_record,
                                              const uint8_t* stack, uint32_t len, uint16_t holes) {
  gs_user_regs regs;
  std::memcpy(&regs, regs_in_record, sizeof(regs));  // records are not aligned in the batch
  len = std::min<uint32_t>(len, GS_STACK_COPY);
  if (holes) {
    // Pieces the probe could not read without a fault: pages of the stack not mapped then. Such
    // a page is nearly always one the thread never touched (a big frame's unused locals: CPython's
    // main thread has them), zeros when read; a page swapped out or being migrated would hold
    // data. So each is read now from the live stack, which maps a never-touched page as zeros
    // and brings back one that held data. A hole lies outside the copy's inner part, under frames
    // the thread has rarely returned from when this runs (milliseconds later). A process gone by
    // then: zeros.
    filled_copy_.assign(stack, stack + len);
    // Piece 0 is the part of sp's page above sp; piece i, the i-th page after it.
    const uint32_t first = GS_STACK_COPY_CHUNK - (regs.sp & (GS_STACK_COPY_CHUNK - 1));
    for (uint32_t i = 0; i <= GS_STACK_COPY / GS_STACK_COPY_CHUNK; i++) {
      const uint32_t off = i ? first + (i - 1) * GS_STACK_COPY_CHUNK : 0;
      if (off >= len) break;
      if (!(holes & (1u << i))) continue;
      const size_t n = std::min<size_t>(i ? GS_STACK_COPY_CHUNK : first, len - off);
      iovec local{filled_copy_.data() + off, n};
      iovec remote{reinterpret_cast<void*>(regs.sp + off), n};
      if (process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) == ssize_t(n)) {
        ++copy_holes_read_;
      } else {
        std::memset(filled_copy_.data() + off, 0, n);
        ++copy_holes_zeroed_;
      }
    }
    stack = filled_copy_.data();
  }
  auto res = unwinder_.unwind(static_cast<pid_t>(pid), static_cast<pid_t>(tid), regs,
                              {stack, len}, GS_MAX_UNWIND_DEPTH);
  const bool truncated = !res.complete && !res.ips.empty();
  return Unwound{std::move(res.ips), truncated};
}

void Pipeline::python_frame_ids(uint64_t py_stack, std::vector<PyFrameId>& out) {
  out.clear();
  const auto* py = python_.sent(py_stack);
  if (!py) return;
  // Names are the sink's ids, good for a process's interpreter and the sink's stack epoch.
  if (const uint64_t gen = python_.generation(); gen != py_frame_ids_generation_ || py_frame_ids_.size() >= kMaxPyFrameIds) {
    py_frame_ids_.clear();
    py_frame_ids_generation_ = gen;
  }
  std::shared_ptr<const discover::PythonLayout> layout;
  bool layout_read = false;
  for (const auto& f : py->frames) {
    const bool entry = f.code & GS_PY_FRAME_ENTRY;
    auto [it, added] = py_frame_ids_.try_emplace(PyFrameKey{uint32_t(py->pid), f.code, f.instr}, 0);
    if (added) {
      if (!layout_read) {
        layout = python_.layout_of(static_cast<pid_t>(py->pid));
        layout_read = true;
      }
      const auto named = python_.name(static_cast<pid_t>(py->pid), layout.get(), f);
      it->second = sink_.intern_python_frame(named.function, named.file, named.line);
    }
    out.push_back({it->second, entry});
  }
  if (py->truncated) out.push_back({sink_.intern_python_frame("[truncated python stack]", "", 0), true});
}

void Pipeline::merge_python(std::vector<store::StoredFrame>& native, const std::vector<bool>& eval_loop,
                            uint64_t py_stack) {
  // A CPU sample's native stack is new nearly every time, so the same Python frames are merged
  // again and again: each is named once (python_frame_ids), not at every merge.
  auto& py = py_frames_scratch_;
  python_frame_ids(py_stack, py);
  if (py.empty()) return;
  if (!python_module_id_) python_module_id_ = sink_.intern_module("[python]", "");
  std::vector<store::StoredFrame> out;
  out.reserve(native.size() + py.size());
  size_t next = 0;  // the innermost Python frame not placed yet
  auto place = [&](size_t i) { out.push_back({python_module_id_, uint64_t(py[i].id), 0}); };
  for (size_t i = 0; i < native.size(); ++i) {
    if (eval_loop[i] && next < py.size()) {
      // One run of the eval loop: its Python frames up to the one C entered it with.
      while (next < py.size()) {
        place(next);
        if (py[next++].entry) break;
      }
      continue;
    }
    out.push_back(native[i]);
  }
  // Eval-loop frames the native walk did not reach (it stopped, or was cut short: its marker
  // stays in between): their Python frames are the outer end of the stack.
  while (next < py.size()) place(next++);
  native = std::move(out);
}

const Pipeline::ResolvedFrame& Pipeline::resolve_frame(uint32_t pid, uint64_t ip) {
  FrameCache& cache = frame_cache_[pid];
  const uint64_t reads = maps_.reads(), python_generation = python_.generation();
  if (cache.maps_reads != reads || cache.python_generation != python_generation ||
      cache.frames.size() >= kMaxResolvedFrames) {
    cache.frames.clear();
    cache.maps_reads = reads;
    cache.python_generation = python_generation;
  }
  auto [it, added] = cache.frames.try_emplace(ip);
  ResolvedFrame& r = it->second;
  if (!added && r.module_id) return r;
  const uint64_t now = monotonic_ns();  // only here: a clock read costs a lookup's time
  if (!added && now - r.asked_ns < kUnmappedRetryNs) return r;
  r = ResolvedFrame{};
  r.asked_ns = now;
  if (auto m = maps_.resolve(pid, ip)) {
    const std::string& build_id = build_id_of(pid, *m);
    r.module_id = sink_.intern_module(m->path, build_id);
    r.offset = m->file_offset;
    r.eval_loop = python_.is_eval_loop(static_cast<pid_t>(pid), m->path, m->file_offset);
    if (!worker_ranges_.empty()) {
      auto file = worker_ranges_.find(worker_file_key(build_id, m->path));
      if (file != worker_ranges_.end()) {
        const auto& ranges = file->second;
        auto it = std::upper_bound(ranges.begin(), ranges.end(), m->file_offset,
                                   [](uint64_t off, const WorkerRange& w) { return off < w.start; });
        if (it != ranges.begin() && m->file_offset < std::prev(it)->end) r.handoff_worker = std::prev(it)->handoff;
      }
    }
  }
  // Resolving may have read the maps: what it found holds for the snapshot read.
  if (maps_.reads() != reads) {
    const ResolvedFrame found = r;
    cache.frames.clear();
    cache.maps_reads = maps_.reads();
    return cache.frames[ip] = found;
  }
  return r;
}

int64_t Pipeline::store_user_stack(uint32_t pid, const std::vector<uint64_t>& ips, bool truncated, uint64_t py_stack,
                                   uint16_t thread_handoff) {
  uint16_t handoff = 0;
  const auto frames = user_stack_frames(pid, ips, truncated, py_stack, handoff);
  // Known by its thread's name alone: the walk stopped before the worker's functions.
  const bool cut = !handoff && thread_handoff && !ips.empty();
  if (cut) handoff = thread_handoff;
  const int64_t id = frames.empty() ? 0 : sink_.intern_stack(frames);
  // Too many worker stacks held: the Stitcher forgot them, and ids cached here must come
  // through here again to be known as workers'.
  if (handoff && !stitcher_.note_worker_stack(id, frames, handoff, cut)) forget_stored_stacks();
  return id;
}

std::vector<store::StoredFrame> Pipeline::user_stack_frames(uint32_t pid, const std::vector<uint64_t>& ips,
                                                            bool truncated, uint64_t py_stack, uint16_t& handoff) {
  std::vector<store::StoredFrame> frames;
  std::vector<bool> eval_loop;
  frames.reserve(ips.size() + 1);
  eval_loop.reserve(ips.size() + 1);
  handoff = 0;
  for (uint64_t ip : ips) {
    const ResolvedFrame& r = resolve_frame(pid, ip);
    frames.push_back({r.module_id, r.offset, ip});
    eval_loop.push_back(py_stack && r.eval_loop);
    if (r.handoff_worker) handoff = r.handoff_worker;
  }
  if (truncated) {
    // The outermost frame says the walk was cut short, so that no one mistakes its last
    // frame for where the thread began.
    frames.push_back(truncated_frame());
    eval_loop.push_back(false);
  }
  if (py_stack) merge_python(frames, eval_loop, py_stack);
  return frames;
}

void Pipeline::forget_stored_stacks() {
  stack_ids_.clear();
  sent_stack_ids_.clear();
  for (auto& [pid, n] : native_stacks_) {
    n.stored.clear();
    n.once_stored.clear();
  }
}

void Pipeline::on_handoff(const gs_call_record& rec) {
  ++handoffs_;
  const Unwound* u = nullptr;
  Unwound copied;
  if (rec.flags & GS_CALL_STACK_COPIED) {
    if (auto it = copied_stacks_.find({rec.tid, rec.ts_ns}); it != copied_stacks_.end()) {
      copied = std::move(it->second);
      copied_stacks_.erase(it);
      u = &copied;
    }
  } else if (rec.native_stack) {
    if (auto p = native_stacks_.find(rec.pid); p != native_stacks_.end())
      if (auto it = p->second.stacks.find(rec.native_stack); it != p->second.stacks.end()) u = &it->second;
  }
  static const std::vector<uint64_t> none;
  uint16_t on_worker = 0;
  const auto frames = user_stack_frames(rec.pid, u ? u->ips : none, u && u->truncated, rec.py_stack, on_worker);
  stitcher_.on_handoff(rec.pid, rec.tid, rec.func, frames, on_worker != 0);
}

uint16_t Pipeline::handoff_thread(const char* comm, size_t len) const {
  if (handoffs_probed_.empty()) return 0;
  const std::string_view name(comm, strnlen(comm, len));
  for (uint16_t id : handoffs_probed_) {
    const auto* h = cuda::handoff_by_id(id);
    if (h && !h->thread_name.empty() && name.starts_with(h->thread_name)) return id;
  }
  return 0;
}

store::StoredFrame Pipeline::truncated_frame() {
  if (!truncated_module_id_) {
    truncated_module_id_ = sink_.intern_module("[truncated]", "");
    sink_.add_symbol(truncated_module_id_, 0, "[truncated stack]");
  }
  return {truncated_module_id_, 0, 0};
}

store::StoredFrame Pipeline::handoff_separator(uint16_t handoff) {
  if (!handoff_module_id_) handoff_module_id_ = sink_.intern_module("[handoff]", "");
  if (handoff_labels_named_.insert(handoff).second)
    if (const auto* h = cuda::handoff_by_id(handoff)) sink_.add_symbol(handoff_module_id_, handoff, std::string(h->label));
  return {handoff_module_id_, handoff, 0};
}

int64_t Pipeline::resolve_kernel(const CallEvent& e) {
  const auto* f = cuda::function_by_id(e.func);
  auto& ids = kernel_ids_[e.pid];
  const uint64_t key = e.kernel_handle ^ (uint64_t(f->api) << 63);  // handles are user addresses: bit 63 is free
  auto cached = ids.find(key);
  if (cached != ids.end() && cached->second) return cached->second;
  std::string name = tracker_.kernel_name(e);
  if (name.empty()) {
    if (const uint64_t addr = tracker_.kernel_name_addr(e)) {
      name = read_name(e.pid, addr, "");
      if (name.empty()) ++names_unread_;
    }
  }
  if (name.empty()) {
    if (cached != ids.end()) return 0;  // the symbol table was already asked
    // No registration or lookup seen (attached to a running process): the runtime's host
    // stub is a function of the program, named like the kernel.
    if (f->api == cuda::Api::Runtime) {
      if (auto m = maps_.resolve(e.pid, e.kernel_handle)) {
        auto frame = symbolizer_.resolve(symbolize::openable_path(e.pid, m->path), build_id_of(e.pid, *m), m->file_offset);
        if (!frame.function.empty() && frame.offset_in_function == 0) name = frame.raw_function;
      }
    }
    if (name.empty()) {
      ids.emplace(key, 0);
      return 0;
    }
  }
  const int64_t id = sink_.intern_kernel(name, elf::demangle(name));
  ids[key] = id;
  return id;
}

void Pipeline::write_lost() {
  const auto lost = bpf_.lost();
  for (int cause = 0; cause < GS_LOST_NR; ++cause) sink_.set_lost(std::string(attach::lost_cause_name(cause)), lost[cause]);
  sink_.set_lost("queue_full", dropped_.load());
  sink_.set_lost("name_unreadable", names_unread_);
  sink_.set_lost("python_frame_unnamed", python_.unnamed_frames());
  sink_.set_lost("unwind_stack_unknown", native_stacks_unknown_);
  // Worker threads' stacks from before any handoff in their process (attached mid-pass).
  sink_.set_lost("handoff_unstitched", stitcher_.orphans());
  stitched_ = stitcher_.stitched();
}

void Pipeline::maybe_commit() {
  const uint64_t now = monotonic_ns();
  if (calls_since_commit_ < cfg_.commit_every_calls && now - last_commit_ns_ < cfg_.commit_interval_ns) return;
  write_lost();
  sink_.commit();
  calls_since_commit_ = 0;
  last_commit_ns_ = now;
}

}  // namespace gpuscope::record
