#include "decode/tracker.h"

#include <algorithm>
#include <utility>

namespace gpuscope::decode {
namespace {

// A thread holds at most this many calls waiting for an enclosing runtime call; past it the
// oldest is handed on as it is (top-level, unless a runtime call around it came), so memory
// stays bounded.
constexpr size_t kMaxHeldPerThread = 256;

bool encloses(const CallEvent& outer, const CallEvent& inner) {
  return outer.ts_ns <= inner.ts_ns && inner.ts_ns + inner.duration_ns <= outer.ts_ns + outer.duration_ns;
}

constexpr uint8_t kSrc = CallEvent::kSrcOnDevice, kDst = CallEvent::kDstOnDevice;

bool is_resolved(cuda::CopyDir d) { return d <= cuda::CopyDir::DeviceToDevice; }

// The sides of a resolved direction that are device memory (kSrc, kDst), and back.
uint8_t device_sides_of(cuda::CopyDir d) {
  switch (d) {
    case cuda::CopyDir::HostToDevice: return kDst;
    case cuda::CopyDir::DeviceToHost: return kSrc;
    case cuda::CopyDir::DeviceToDevice: return kSrc | kDst;
    default: return 0;
  }
}
cuda::CopyDir dir_of(uint8_t device) {
  static constexpr cuda::CopyDir kDirs[4] = {cuda::CopyDir::HostToHost, cuda::CopyDir::DeviceToHost, cuda::CopyDir::HostToDevice,
                                       cuda::CopyDir::DeviceToDevice};
  return kDirs[device & (kSrc | kDst)];
}

// `to` takes `from`'s sides where `sides` says: the rest of its direction is its own.
void take_sides(CallEvent& to, const CallEvent& from, uint8_t sides) {
  const uint8_t device = (device_sides_of(to.dir) & ~sides) | (device_sides_of(from.dir) & sides);
  to.dir = dir_of(device);
}

}  // namespace

void AllocationMap::add(uint64_t ptr, uint64_t size, cuda::MemKind kind) {
  if (ptr == 0) return;
  ranges_[ptr] = Range{size, kind};
}

void AllocationMap::remove(uint64_t ptr) { ranges_.erase(ptr); }

cuda::MemKind AllocationMap::lookup(uint64_t addr) const {
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin()) return cuda::MemKind::None;
  --it;
  return addr - it->first < std::max<uint64_t>(it->second.size, 1) ? it->second.kind : cuda::MemKind::None;
}

HostMem Tracker::host_kind(const ProcessState& p, uint64_t addr) const {
  switch (p.allocations.lookup(addr)) {
    case cuda::MemKind::PinnedHost:
    case cuda::MemKind::RegisteredHost:
      return HostMem::Pinned;
    case cuda::MemKind::None:
      return complete_history_ || p.complete_history ? HostMem::Pageable : HostMem::Unknown;
    default:
      return HostMem::Unknown;
  }
}

void Tracker::resolve_copy(ProcessState& p, CallEvent& e) const {
  // A copy whose extent is in an array's elements: bytes from the array's element size, unknown
  // for an array whose creation was not seen (or whose format has no whole-byte element).
  for (const auto& [array, elems] : e.in_elements) {
    if (!array && !elems) continue;
    auto it = p.array_elem_size.find(array);
    if (it == p.array_elem_size.end() || !it->second)
      e.bytes_known = false;
    else
      e.bytes += elems * it->second;
  }
  if (e.dir == cuda::CopyDir::Default) {
    // A side known to be device memory (an array, a symbol) whatever the allocations say; one
    // that no tracked allocation or lookup contains is taken as host memory, a guess.
    uint8_t device = e.device_sides & (kSrc | kDst);
    for (auto [side, addr] : {std::pair{kSrc, e.src}, std::pair{kDst, e.ptr}}) {
      if (device & side) continue;
      const cuda::MemKind k = p.allocations.lookup(addr);
      if (k == cuda::MemKind::Device || k == cuda::MemKind::Managed)
        device |= side;
      else if (k == cuda::MemKind::None)
        e.guessed_sides |= side;
    }
    e.dir = dir_of(device);
  }
  set_host_mem(p, e);
}

void Tracker::set_host_mem(const ProcessState& p, CallEvent& e) const {
  switch (e.dir) {
    case cuda::CopyDir::HostToDevice: e.host_mem = host_kind(p, e.src); break;
    case cuda::CopyDir::DeviceToHost: e.host_mem = host_kind(p, e.ptr); break;
    case cuda::CopyDir::HostToHost: e.host_mem = host_kind(p, e.src); break;
    default: e.host_mem = HostMem::NotApplicable; break;
  }
}

void Tracker::update_state(ProcessState& p, const CallEvent& e) {
  const cuda::FunctionSpec* f = cuda::function_by_id(e.func);
  if (!f || (e.has_return && e.ret != 0)) return;
  switch (f->kind) {
    case cuda::CallKind::Alloc:
      if (e.ptr) p.allocations.add(e.ptr, e.bytes, f->mem);
      break;
    case cuda::CallKind::Free:
      p.allocations.remove(e.ptr);
      break;
    case cuda::CallKind::HostRegister:
      p.allocations.add(e.ptr, e.bytes, cuda::MemKind::RegisteredHost);
      break;
    case cuda::CallKind::HostUnregister:
      p.allocations.remove(e.ptr);
      break;
    case cuda::CallKind::ArrayCreate:
      if (!e.ptr) break;
      if (f->sig == cuda::Signature::MipmapLevel) {  // a level has its mipmapped array's format
        auto it = p.mipmap_elem_size.find(e.src);
        p.array_elem_size[e.ptr] = it == p.mipmap_elem_size.end() ? 0 : it->second;
      } else {
        (f->mem == cuda::MemKind::MipmappedArray ? p.mipmap_elem_size : p.array_elem_size)[e.ptr] = e.elem_size;
      }
      break;
    case cuda::CallKind::ArrayDestroy:
      (f->mem == cuda::MemKind::MipmappedArray ? p.mipmap_elem_size : p.array_elem_size).erase(e.ptr);
      break;
    case cuda::CallKind::SymbolLookup:
      // A module global is device (or managed) memory for as long as its module is loaded;
      // module unloads are not probed, and a later allocation at its address replaces it. A size
      // not read leaves the address alone known.
      if (e.ptr) p.allocations.add(e.ptr, e.bytes_known ? e.bytes : 0, f->mem);
      break;
    case cuda::CallKind::KernelLookup:
      if (f->sig == cuda::Signature::RegisterFunction) {
        if (!e.name.empty() || e.name_addr) p.stub_names[e.kernel_handle] = {e.name, e.name.empty() ? e.name_addr : 0};
      } else if (f->sig == cuda::Signature::NamedLookup) {
        if (e.out_valid && !e.name.empty()) p.handle_names[e.out_handle] = {e.name, 0};
      } else if (e.out_valid) {  // cuKernelGetFunction: the function is named as its kernel
        auto it = p.handle_names.find(e.kernel_handle);
        // A handle read after the call without its result (GS_CALL_OUT_LATER) is what a failed
        // lookup left there, if it failed: it names only a function not named yet.
        if (it != p.handle_names.end()) {
          if (e.out_unchecked)
            p.handle_names.try_emplace(e.out_handle, it->second);
          else
            p.handle_names[e.out_handle] = it->second;
        } else if (!e.out_unchecked) {
          p.kernel_of_function[e.out_handle] = e.kernel_handle;
        }
      }
      break;
    default:
      break;
  }
}

void Tracker::learn_function_name(uint32_t pid, uint64_t function, std::string name) {
  // A lookup's name, where one was seen, stays: they are the same name.
  processes_[pid].handle_names.try_emplace(function, KernelName{std::move(name), 0});
}

const Tracker::KernelName* Tracker::find_kernel_name(const CallEvent& e) const {
  auto pit = processes_.find(e.pid);
  if (pit == processes_.end()) return nullptr;
  const cuda::FunctionSpec* f = cuda::function_by_id(e.func);
  const auto& names = (f && f->api == cuda::Api::Runtime) ? pit->second.stub_names : pit->second.handle_names;
  auto it = names.find(e.kernel_handle);
  if (it != names.end()) return &it->second;
  if (&names == &pit->second.handle_names) {
    auto k = pit->second.kernel_of_function.find(e.kernel_handle);
    if (k != pit->second.kernel_of_function.end()) it = names.find(k->second);
  }
  return it == names.end() ? nullptr : &it->second;
}

std::string Tracker::kernel_name(const CallEvent& e) const {
  const KernelName* k = find_kernel_name(e);
  return k ? k->name : std::string{};
}

uint64_t Tracker::kernel_name_addr(const CallEvent& e) const {
  const KernelName* k = find_kernel_name(e);
  return k && k->name.empty() ? k->addr : 0;
}

void Tracker::settle_runtime_launch(ThreadState& t, CallEvent* driver_launch,
                                    const std::function<void(CallEvent&)>& emit) {
  if (!t.held_runtime_launch) return;
  CallEvent& rt = *t.held_runtime_launch;
  if (driver_launch) {
    rt.driver_func = driver_launch->func;
    rt.driver_handle = driver_launch->kernel_handle;
    ProcessState& p = processes_[rt.pid];
    // The runtime names kernels by host stub (registrations); the driver by handle (lookups).
    // Whichever side knows the name teaches the other, so every later launch is named at once.
    auto stub = p.stub_names.find(rt.kernel_handle);
    auto handle = p.handle_names.find(driver_launch->kernel_handle);
    if (stub == p.stub_names.end() && handle != p.handle_names.end())
      p.stub_names.emplace(rt.kernel_handle, handle->second);
    else if (stub != p.stub_names.end() && handle == p.handle_names.end())
      p.handle_names.emplace(driver_launch->kernel_handle, stub->second);
  }
  emit(rt);
  t.held_runtime_launch.reset();
}

void Tracker::process(CallEvent e, const std::function<void(CallEvent&)>& emit) {
  const cuda::FunctionSpec* f = cuda::function_by_id(e.func);
  if (!f) return;
  e.call_id = next_call_id_++;
  ProcessState& p = processes_[e.pid];
  ThreadState& t = threads_[e.tid];
  t.pid = e.pid;

  if (f->kind == cuda::CallKind::Memcpy) resolve_copy(p, e);
  update_state(p, e);

  const bool driver_launch = f->api == cuda::Api::Driver && f->kind == cuda::CallKind::Launch;
  if (driver_launch && t.held_runtime_launch) {
    settle_runtime_launch(t, &e, emit);
    return;  // folded into the runtime launch's row
  }
  // Driver calls before the driver launch are the runtime launch's own (its kernel's function
  // looked up, its module loaded on first use): they leave it waiting for its driver launch.
  if (f->api != cuda::Api::Driver) settle_runtime_launch(t, nullptr, emit);

  if (f->api == cuda::Api::Runtime) {
    if (e.has_return) {
      nest_inner_calls(p, t, *f, e);
      if (e.under_runtime) {
        // A call the runtime made inside another of its calls: that call returns later, and is
        // its parent. What this one enclosed stays held with it, for that call's stack.
        hold(t, std::move(e), emit);
        return;
      }
      // A top-level call: the held calls either ran inside it or before it.
      for (CallEvent& d : t.held_calls) {
        // Made inside this call, they took no stack of their own (GS_CALL_UNDER_RUNTIME).
        if (encloses(e, d) && !d.stack_id) d.stack_id = e.stack_id;
        emit(d);
      }
      t.held_calls.clear();
    }
    if (f->kind == cuda::CallKind::Launch)
      t.held_runtime_launch = std::move(e);
    else
      emit(e);
    return;
  }

  if (f->api == cuda::Api::Nccl && e.nccl) group_nccl_call(t, *f, e);
  // NCCL's calls are never made inside a runtime call: as they come.
  if (!e.has_return || f->api == cuda::Api::Nccl) {
    emit(e);
    return;
  }
  hold(t, std::move(e), emit);
}

void Tracker::group_nccl_call(ThreadState& t, const cuda::FunctionSpec& f, CallEvent& e) {
  if (f.kind == cuda::CallKind::Group) {
    if (f.symbol == "ncclGroupStart") {
      if (t.nccl_group_depth++ == 0) t.nccl_group = e.call_id;
      e.nccl->group = t.nccl_group;
    } else {  // ncclGroupEnd: it launches the group's work
      e.nccl->group = t.nccl_group;
      if (t.nccl_group_depth > 0 && --t.nccl_group_depth == 0) t.nccl_group = 0;
    }
  } else if (t.nccl_group_depth > 0) {
    e.nccl->group = t.nccl_group;
  }
}

void Tracker::hold(ThreadState& t, CallEvent e, const std::function<void(CallEvent&)>& emit) {
  t.held_calls.push_back(std::move(e));
  if (t.held_calls.size() > kMaxHeldPerThread) {
    emit(t.held_calls.front());
    t.held_calls.pop_front();
  }
}

void Tracker::nest_inner_calls(const ProcessState& p, ThreadState& t, const cuda::FunctionSpec& f, CallEvent& e) {
  // Inner calls return first: a held call enclosed by `e` with a parent already is inside a
  // runtime call that `e` encloses too.
  int same_kind = 0;  // calls of e's kind made directly inside it, driver or runtime
  bool by_driver = false;
  uint64_t inner_bytes = 0;
  bool inner_bytes_known = true;
  std::vector<CallEvent*> inner_copies;  // deque elements stay put while nothing is added
  for (CallEvent& d : t.held_calls) {
    if (!encloses(e, d) || d.parent_id) continue;
    d.parent_id = e.call_id;
    const cuda::FunctionSpec* df = cuda::function_by_id(d.func);
    if (!df || df->kind != f.kind) continue;
    ++same_kind;
    if (f.kind == cuda::CallKind::Memcpy) inner_copies.push_back(&d);
    if (df->api != cuda::Api::Driver) continue;
    by_driver = true;
    if (f.kind == cuda::CallKind::Memcpy) {
      inner_bytes += d.bytes;
      inner_bytes_known &= d.bytes_known;
    }
  }
  bool carried = by_driver && same_kind == 1;
  if (f.kind == cuda::CallKind::Memcpy) {
    // A runtime copy in the elements of an array not seen created (cudaMemcpy3D of an array
    // made before gpuscope came): the driver copies it made say it in bytes.
    if (!e.bytes_known && by_driver && inner_bytes_known) {
      e.bytes = inner_bytes;
      e.bytes_known = true;
    }
    if (inner_copies.size() == 1) learn_sides(p, e, *inner_copies.front());
    // The driver's row stands for this one only if it tells the direction by itself: a
    // cuMemcpy of a symbol whose lookup was not seen would say host to host.
    if (carried && is_resolved(e.dir)) carried = inner_copies.front()->dir == e.dir;
    for (CallEvent* d : inner_copies) settle_sides(p, t, e, *d);
  }
  // Its row is carried whole by the driver only if one driver call of its kind stands for it.
  weigh_runtime_call(p, f, e, carried);
}

void Tracker::learn_sides(const ProcessState& p, CallEvent& e, const CallEvent& inner) const {
  // The one copy a runtime copy made knows sides the runtime copy could only guess (a driver
  // copy of a fixed direction, an address of a tracked allocation or symbol, where the runtime
  // copy had another): the same data moves between the same memories.
  if (!is_resolved(inner.dir)) return;
  const uint8_t learnt = e.guessed_sides & ~inner.guessed_sides;
  if (!learnt) return;
  take_sides(e, inner, learnt);
  e.guessed_sides &= ~learnt;
  set_host_mem(p, e);
}

void Tracker::settle_sides(const ProcessState& p, ThreadState& t, const CallEvent& outer, CallEvent& d) const {
  // A copy made inside a runtime copy whose direction is known does not contradict it on a side
  // it could only guess from pointers the tracker does not know (a symbol's device address whose
  // lookup was not seen, memory mapped by calls not probed): that side is the outer copy's. A
  // side it knows (a fixed-direction driver copy, a tracked allocation, an array) stays its own.
  // Its guesses stay marked: the copies inside it are settled again from it, and it from a
  // runtime call around it.
  if (!is_resolved(outer.dir) || !is_resolved(d.dir) || !d.guessed_sides) return;
  const cuda::CopyDir before = d.dir;
  take_sides(d, outer, d.guessed_sides);
  if (d.dir == before) return;
  set_host_mem(p, d);
  for (CallEvent& c : t.held_calls)
    if (c.parent_id == d.call_id && c.guessed_sides) settle_sides(p, t, d, c);
}

void Tracker::weigh_runtime_call(const ProcessState& p, const cuda::FunctionSpec& f, const CallEvent& e,
                                 bool through_driver) {
  if (!cuda::may_be_recorded_by_driver(f)) return;
  RuntimeEvidence& ev = runtime_evidence_[f.id];
  if (ev.alone || ev.through_driver >= kRedundantAfter) return;  // decided
  if (!through_driver) {
    if (p.driver_probed_ns <= e.ts_ns) ev.alone = true;
    return;
  }
  if (++ev.through_driver == kRedundantAfter) redundant_runtime_.push_back(f.id);
}

void Tracker::note_driver_probed(uint32_t pid, uint64_t ts_ns) {
  uint64_t& probed = processes_[pid].driver_probed_ns;
  probed = std::min(probed, ts_ns);
}

std::vector<uint16_t> Tracker::take_redundant_runtime_functions() {
  std::vector<uint16_t> out;
  out.swap(redundant_runtime_);
  return out;
}

void Tracker::flush(const std::function<void(CallEvent&)>& emit) {
  for (auto& [tid, t] : threads_) {
    settle_runtime_launch(t, nullptr, emit);
    for (auto& d : t.held_calls) emit(d);
    t.held_calls.clear();
  }
}

void Tracker::flush_process(uint32_t pid, const std::function<void(CallEvent&)>& emit) {
  for (auto& [tid, t] : threads_) {
    if (t.pid != pid) continue;
    settle_runtime_launch(t, nullptr, emit);
    for (auto& d : t.held_calls) emit(d);
    t.held_calls.clear();
  }
}

void Tracker::forget_process(uint32_t pid) {
  processes_.erase(pid);
  // Threads are keyed by tid; the process's held calls were flushed by the caller (flush_process).
  std::erase_if(threads_, [pid](const auto& kv) {
    return kv.second.pid == pid || (kv.second.held_calls.empty() && !kv.second.held_runtime_launch);
  });
}

}  // namespace gpuscope::decode

