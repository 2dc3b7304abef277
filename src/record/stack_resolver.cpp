#include "record/stack_resolver.h"

#include <sys/uio.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "common/clock.h"
#include "cuda/handoffs.h"
#include "discover/proc.h"

namespace gpuscope::record {

StackResolver::StackResolver(store::EventSink& sink, StackMaps& kernel, symbolize::ProcessMaps& maps,
                             BuildIds& build_ids, double recycle_stacks_at)
    : sink_(sink), kernel_(kernel), maps_(maps), build_ids_(build_ids), unwinder_(maps),
      stack_gens_(recycle_stacks_at, kernel.kernel_stack_entries()),
      stitcher_([this](const Stitcher::Frames& f) { return f.empty() ? 0 : sink_.intern_stack(f); },
                [this](uint16_t handoff) { return handoff_separator(handoff); },
                [this] { return truncated_frame(); }) {}

void StackResolver::subscribe(ProcessLifetime& lifetime) {
  lifetime.on_exit([this](uint32_t pid, uint64_t) { forget_process(pid); });
  lifetime.on_exec([this](uint32_t pid, uint64_t) { forget_program(pid); });
}

void StackResolver::forget_process(uint32_t pid) {
  stitcher_.forget_process(pid);
  stack_ids_.erase(pid);
  sent_stack_ids_.erase(pid);
  frame_cache_.erase(pid);
  unwinder_.forget(static_cast<pid_t>(pid));
  python_.forget(static_cast<pid_t>(pid));
  forget_native_stacks(pid);  // a later process with this pid walks other code
}

void StackResolver::forget_program(uint32_t pid) {
  unwinder_.forget(static_cast<pid_t>(pid));
  // The same addresses are other code in the new program.
  frame_cache_.erase(pid);
  stack_ids_.erase(pid);
  sent_stack_ids_.erase(pid);
  forget_native_stacks(pid);
}

void StackResolver::add_handoff_workers(const std::string& build_id, const std::string& path,
                                        std::vector<WorkerRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const WorkerRange& a, const WorkerRange& b) { return a.start < b.start; });
  std::lock_guard lock(mu_);
  new_worker_ranges_.emplace_back(worker_file_key(build_id, path), std::move(ranges));
}

std::string StackResolver::worker_file_key(const std::string& build_id, const std::string& path) {
  return build_id.empty() ? "path:" + path : build_id;
}

void StackResolver::begin_batch() {
  std::vector<std::pair<std::string, std::vector<WorkerRange>>> ranges;
  {
    std::lock_guard lock(mu_);
    ranges.swap(new_worker_ranges_);
  }
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
}

void StackResolver::on_stack_copy(const uint8_t* data, size_t size) {
  // Unwound now, while the process's mappings are as they were at the call; the call's record
  // follows (at the call's return, for calls with one).
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
  // Bounded: a copy whose call record was lost must not stay forever.
  if (copied_stacks_.size() >= kMaxCopiedStacks) copied_stacks_.clear();
  auto& unwound = copied_stacks_[{tid, ts}] =
      unwind_stack_copy(pid, tid, data + offsetof(R, regs), data + offsetof(R, data), len, holes);
  if (copy_unwound_) copy_unwound_(pid, unwound.ips);
}

void StackResolver::on_python_stack(const uint8_t* data, size_t size) {
  // A new generation drops the one before the current: calls recorded before the BPF side
  // forgot the stacks sent (at the last switch) may name its stacks, and they can still be in
  // the queue when this pipeline lags behind (it unwinds stack copies): wait until it has
  // passed that moment, holding more stacks meanwhile.
  if (python_.stacks_held() >= kMaxPythonStacks && newest_ts_ns_ >= python_forgotten_ns_) {
    kernel_.forget_python_stacks();
    python_forgotten_ns_ = monotonic_ns();
    python_.new_generation();
    ++python_generations_;
  }
  python_.on_stack(data, size);
}

int64_t StackResolver::call_stack(const gs_call_record& rec, uint64_t py_stack) {
  const uint16_t thread_handoff = handoff_thread(rec.comm, sizeof(rec.comm));
  int64_t id = 0;
  if (rec.flags & GS_CALL_STACK_COPIED) id = take_sent_stack(rec.pid, rec.tid, rec.ts_ns, py_stack, thread_handoff);
  if (rec.native_stack) id = native_stack(rec.pid, rec.native_stack, py_stack, thread_handoff);
  return id;
}

int64_t StackResolver::finish_call_stack(uint32_t pid, uint32_t tid, int64_t stack_id, uint64_t py_stack) {
  if (!stack_id) stack_id = python_only_stack(pid, py_stack);
  return stitcher_.stitch(pid, tid, stack_id);
}

StackResolver::SampleStacks StackResolver::sample_stacks(const gs_sample_record& rec, const uint8_t* data, size_t size) {
  int64_t user = 0;
  const uint16_t thread_handoff = handoff_thread(rec.comm, sizeof(rec.comm));
  if (size >= sizeof(gs_sample_stack_record)) {
    // The stack copy is read in place: it is most of the record.
    using R = gs_sample_stack_record;
    uint32_t len;
    uint16_t holes;
    std::memcpy(&len, data + offsetof(R, stack_len), sizeof(len));
    std::memcpy(&holes, data + offsetof(R, holes), sizeof(holes));
    const auto u = unwind_stack_copy(rec.pid, rec.tid, data + offsetof(R, regs), data + offsetof(R, data), len, holes);
    user = store_user_stack(rec.pid, u.ips, u.truncated, rec.py_stack, thread_handoff);
  } else if (rec.native_stack) {
    user = native_stack(rec.pid, rec.native_stack, rec.py_stack, thread_handoff);
  } else {
    user = python_only_stack(rec.pid, rec.py_stack);
  }
  return {stitcher_.stitch(rec.pid, rec.tid, user), kernel_stack(rec.kstack_id, rec.ts_ns)};
}

StackStats StackResolver::stats() const {
  return StackStats{stack_recycles_.load(), stacks_expired_.load(), python_generations_.load(),
                    handoffs_.load(),       stitched_.load(),       copy_holes_read_.load(),
                    copy_holes_zeroed_.load()};
}

std::vector<std::pair<const char*, uint64_t>> StackResolver::lost() {
  stitched_ = stitcher_.stitched();
  return {{"python_frame_unnamed", python_.unnamed_frames()},
          {"unwind_stack_unknown", native_stacks_unknown_},
          // Worker threads' stacks from before any handoff in their process (attached mid-pass).
          {"handoff_unstitched", stitcher_.orphans()}};
}

int64_t StackResolver::kernel_stack(int32_t bpf_stack_id, uint64_t ts_ns) {
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
  for (uint64_t ip : kernel_.kernel_stack(bpf_stack_id)) {
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

int64_t StackResolver::python_only_stack(uint32_t pid, uint64_t py_stack) {
  if (!py_stack) return 0;
  auto& ids = stack_ids_[pid];
  if (auto it = ids.find(py_stack); it != ids.end()) return it->second;
  if (ids.size() >= kMaxPythonStacks) ids.clear();
  const int64_t id = store_user_stack(pid, {}, false, py_stack);
  ids.emplace(py_stack, id);
  return id;
}

int64_t StackResolver::take_sent_stack(uint32_t pid, uint32_t tid, uint64_t ts_ns, uint64_t py_stack,
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

void StackResolver::on_native_stack(const uint8_t* data, size_t size) {
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

int64_t StackResolver::native_stack(uint32_t pid, uint64_t id, uint64_t py_stack, uint16_t thread_handoff) {
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

void StackResolver::forget_native_stacks(uint32_t pid) {
  auto it = native_stacks_.find(pid);
  if (it == native_stacks_.end()) return;
  std::vector<uint64_t> ids;
  ids.reserve(it->second.stacks.size());
  for (const auto& [id, u] : it->second.stacks) ids.push_back(id);
  kernel_.forget_native_stacks(ids);
  native_stacks_.erase(it);
}

bool StackResolver::stack_expired(int32_t bpf_stack_id, uint64_t ts_ns) {
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
void StackResolver::recycle(uint64_t taken_ns) {
  switch (stack_gens_.next(taken_ns)) {
    case StackGenerations::Step::None:
      return;
    case StackGenerations::Step::Flip:
      stack_gens_.flipped(kernel_.flip_kernel_stacks(), monotonic_ns());
      return;
    case StackGenerations::Step::Empty:
      break;
  }
  const int old = stack_gens_.current() ^ 1;
  auto in_old = [old](int32_t id) { return id >= 0 && StackGenerations::generation_of(id) == old; };
  std::erase_if(kernel_stack_ids_, [&](const auto& kv) { return in_old(kv.first); });
  kernel_.clear_kernel_stacks(old);
  stack_gens_.emptied(monotonic_ns());
  ++stack_recycles_;
}

StackResolver::Unwound StackResolver::unwind_stack_copy(uint32_t pid, uint32_t tid, const uint8_t* regs_in_record,
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

void StackResolver::python_frame_ids(uint64_t py_stack, std::vector<PyFrameId>& out) {
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

void StackResolver::merge_python(std::vector<store::StoredFrame>& native, const std::vector<bool>& eval_loop,
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

const StackResolver::ResolvedFrame& StackResolver::resolve_frame(uint32_t pid, uint64_t ip) {
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
    const std::string& build_id = build_ids_.of(pid, *m);
    r.module_id = sink_.intern_module(m->path, build_id);
    r.offset = m->file_offset;
    r.eval_loop = python_.is_eval_loop(static_cast<pid_t>(pid), m->path, m->file_offset);
    r.hooks = discover::is_launch_hooks_library(m->path);
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

int64_t StackResolver::store_user_stack(uint32_t pid, const std::vector<uint64_t>& ips, bool truncated, uint64_t py_stack,
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

std::vector<store::StoredFrame> StackResolver::user_stack_frames(uint32_t pid, const std::vector<uint64_t>& ips,
                                                            bool truncated, uint64_t py_stack, uint16_t& handoff) {
  std::vector<store::StoredFrame> frames;
  std::vector<bool> eval_loop;
  frames.reserve(ips.size() + 1);
  eval_loop.reserve(ips.size() + 1);
  handoff = 0;
  bool top = true;
  for (uint64_t ip : ips) {
    const ResolvedFrame& r = resolve_frame(pid, ip);
    if (top && r.hooks) continue;
    top = false;
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

void StackResolver::forget_stored_stacks() {
  stack_ids_.clear();
  sent_stack_ids_.clear();
  for (auto& [pid, n] : native_stacks_) {
    n.stored.clear();
    n.once_stored.clear();
  }
}

void StackResolver::on_handoff(const gs_call_record& rec) {
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

uint16_t StackResolver::handoff_thread(const char* comm, size_t len) const {
  if (handoffs_probed_.empty()) return 0;
  const std::string_view name(comm, strnlen(comm, len));
  for (uint16_t id : handoffs_probed_) {
    const auto* h = cuda::handoff_by_id(id);
    if (h && !h->thread_name.empty() && name.starts_with(h->thread_name)) return id;
  }
  return 0;
}

store::StoredFrame StackResolver::truncated_frame() {
  if (!truncated_module_id_) {
    truncated_module_id_ = sink_.intern_module("[truncated]", "");
    sink_.add_symbol(truncated_module_id_, 0, "[truncated stack]");
  }
  return {truncated_module_id_, 0, 0};
}

store::StoredFrame StackResolver::handoff_separator(uint16_t handoff) {
  if (!handoff_module_id_) handoff_module_id_ = sink_.intern_module("[handoff]", "");
  if (handoff_labels_named_.insert(handoff).second)
    if (const auto* h = cuda::handoff_by_id(handoff)) sink_.add_symbol(handoff_module_id_, handoff, std::string(h->label));
  return {handoff_module_id_, handoff, 0};
}

}  // namespace gpuscope::record
