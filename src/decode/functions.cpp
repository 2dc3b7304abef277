#include "decode/functions.h"

#include <array>
#include <unordered_map>

#include "events.h"

namespace gpuscope::decode {
namespace {

constexpr uint8_t kLaunchConfigLen = 56;  // cudaLaunchConfig_t and CUlaunchConfig up to numAttrs
constexpr uint8_t kMemcpy2DLen = 128;     // CUDA_MEMCPY2D

using enum Api;
using enum CallKind;
using enum Signature;

constexpr FunctionSpec launch(uint16_t id, std::string_view sym, Api api, Signature sig) {
  FunctionSpec f{id, sym, api, Launch, sig, false};
  if (sig == RtLaunchExC || sig == DrvLaunchEx) {
    f.entry_deref_arg = 0;
    f.entry_deref_len = kLaunchConfigLen;
  }
  return f;
}
constexpr FunctionSpec alloc(uint16_t id, std::string_view sym, Api api, MemKind mem, bool async = false) {
  FunctionSpec f{id, sym, api, Alloc, AllocOut, true};
  f.return_out_arg = 0;
  f.mem = mem;
  f.async = async;
  return f;
}
constexpr FunctionSpec free_(uint16_t id, std::string_view sym, Api api, MemKind mem, bool async = false) {
  FunctionSpec f{id, sym, api, Free, PtrOnly, true};
  f.mem = mem;
  f.async = async;
  return f;
}
constexpr FunctionSpec memcpy_(uint16_t id, std::string_view sym, Api api, Signature sig, bool async,
                               CopyDir dir = CopyDir::Unknown) {
  FunctionSpec f{id, sym, api, Memcpy, sig, true};
  f.async = async;
  f.fixed_dir = dir;
  if (sig == DrvMemcpy2D) {
    f.entry_deref_arg = 0;
    f.entry_deref_len = kMemcpy2DLen;
  }
  return f;
}
constexpr FunctionSpec memset_(uint16_t id, std::string_view sym, Api api, bool async, uint8_t elem = 1) {
  FunctionSpec f{id, sym, api, CallKind::Memset, MemsetArgs, true};
  f.async = async;
  f.elem_size = elem;
  return f;
}
constexpr FunctionSpec sync(uint16_t id, std::string_view sym, Api api, Signature sig) {
  return FunctionSpec{id, sym, api, Sync, sig, true};
}
constexpr FunctionSpec named_lookup(uint16_t id, std::string_view sym) {
  FunctionSpec f{id, sym, Driver, KernelLookup, NamedLookup, true};
  f.entry_deref_arg = 2;
  f.entry_deref_len = GS_DEREF_LEN;
  f.entry_deref_string = true;
  f.return_out_arg = 0;
  return f;
}

// Ids are stored in record files: append, never renumber.
constexpr auto kFunctions = std::to_array<FunctionSpec>({
    launch(1, "cudaLaunchKernel", Runtime, RtLaunch),
    launch(2, "cudaLaunchKernel_ptsz", Runtime, RtLaunch),
    launch(3, "cudaLaunchKernelExC", Runtime, RtLaunchExC),
    launch(4, "cudaLaunchKernelExC_ptsz", Runtime, RtLaunchExC),
    launch(5, "cudaLaunchCooperativeKernel", Runtime, RtLaunch),
    launch(6, "cudaLaunchCooperativeKernel_ptsz", Runtime, RtLaunch),
    {7, "cudaGraphLaunch", Runtime, GraphLaunch, GraphArgs, true},
    {8, "cudaGraphLaunch_ptsz", Runtime, GraphLaunch, GraphArgs, true},
    alloc(10, "cudaMalloc", Runtime, MemKind::Device),
    alloc(11, "cudaMallocAsync", Runtime, MemKind::Device, true),
    alloc(12, "cudaMallocAsync_ptsz", Runtime, MemKind::Device, true),
    alloc(13, "cudaMallocManaged", Runtime, MemKind::Managed),
    alloc(14, "cudaMallocHost", Runtime, MemKind::PinnedHost),
    alloc(15, "cudaHostAlloc", Runtime, MemKind::PinnedHost),
    {16, "cudaHostRegister", Runtime, HostRegister, RegisterArgs, true},
    {17, "cudaHostUnregister", Runtime, HostUnregister, PtrOnly, true},
    free_(18, "cudaFree", Runtime, MemKind::Device),
    free_(19, "cudaFreeAsync", Runtime, MemKind::Device, true),
    free_(20, "cudaFreeAsync_ptsz", Runtime, MemKind::Device, true),
    free_(21, "cudaFreeHost", Runtime, MemKind::PinnedHost),
    memcpy_(30, "cudaMemcpy", Runtime, RtMemcpy, false),
    memcpy_(31, "cudaMemcpy_ptds", Runtime, RtMemcpy, false),
    memcpy_(32, "cudaMemcpyAsync", Runtime, RtMemcpy, true),
    memcpy_(33, "cudaMemcpyAsync_ptsz", Runtime, RtMemcpy, true),
    memcpy_(34, "cudaMemcpy2D", Runtime, RtMemcpy2D, false),
    memcpy_(35, "cudaMemcpy2D_ptds", Runtime, RtMemcpy2D, false),
    memcpy_(36, "cudaMemcpy2DAsync", Runtime, RtMemcpy2D, true),
    memcpy_(37, "cudaMemcpy2DAsync_ptsz", Runtime, RtMemcpy2D, true),
    memset_(40, "cudaMemset", Runtime, false),
    memset_(41, "cudaMemset_ptds", Runtime, false),
    memset_(42, "cudaMemsetAsync", Runtime, true),
    memset_(43, "cudaMemsetAsync_ptsz", Runtime, true),
    sync(50, "cudaStreamSynchronize", Runtime, StreamArg),
    sync(51, "cudaStreamSynchronize_ptsz", Runtime, StreamArg),
    sync(52, "cudaDeviceSynchronize", Runtime, NoArgs),
    sync(53, "cudaEventSynchronize", Runtime, StreamArg),
    sync(54, "cudaStreamWaitEvent", Runtime, StreamArg),
    sync(55, "cudaStreamWaitEvent_ptsz", Runtime, StreamArg),
    // Its name argument lives in the binary's read-only data, often not yet paged in when
    // the registration runs at start-up: user space reads it (Pipeline::read_name).
    {60, "__cudaRegisterFunction", Runtime, KernelLookup, RegisterFunction, false},

    launch(100, "cuLaunchKernel", Driver, DrvLaunch),
    launch(101, "cuLaunchKernel_ptsz", Driver, DrvLaunch),
    launch(102, "cuLaunchKernelEx", Driver, DrvLaunchEx),
    launch(103, "cuLaunchKernelEx_ptsz", Driver, DrvLaunchEx),
    launch(104, "cuLaunchCooperativeKernel", Driver, DrvLaunch),
    {105, "cuGraphLaunch", Driver, GraphLaunch, GraphArgs, true},
    {106, "cuGraphLaunch_ptsz", Driver, GraphLaunch, GraphArgs, true},
    alloc(110, "cuMemAlloc_v2", Driver, MemKind::Device),
    alloc(111, "cuMemAllocAsync", Driver, MemKind::Device, true),
    alloc(112, "cuMemAllocAsync_ptsz", Driver, MemKind::Device, true),
    alloc(113, "cuMemAllocManaged", Driver, MemKind::Managed),
    alloc(114, "cuMemHostAlloc", Driver, MemKind::PinnedHost),
    alloc(115, "cuMemAllocHost_v2", Driver, MemKind::PinnedHost),
    {116, "cuMemHostRegister_v2", Driver, HostRegister, RegisterArgs, true},
    {117, "cuMemHostUnregister", Driver, HostUnregister, PtrOnly, true},
    free_(118, "cuMemFree_v2", Driver, MemKind::Device),
    free_(119, "cuMemFreeAsync", Driver, MemKind::Device, true),
    free_(120, "cuMemFreeAsync_ptsz", Driver, MemKind::Device, true),
    free_(121, "cuMemFreeHost", Driver, MemKind::PinnedHost),
    memcpy_(130, "cuMemcpy", Driver, DrvMemcpy, false, CopyDir::Default),
    memcpy_(131, "cuMemcpyAsync", Driver, DrvMemcpy, true, CopyDir::Default),
    memcpy_(132, "cuMemcpyAsync_ptsz", Driver, DrvMemcpy, true, CopyDir::Default),
    memcpy_(133, "cuMemcpyHtoD_v2", Driver, DrvMemcpy, false, CopyDir::HostToDevice),
    memcpy_(134, "cuMemcpyDtoH_v2", Driver, DrvMemcpy, false, CopyDir::DeviceToHost),
    memcpy_(135, "cuMemcpyDtoD_v2", Driver, DrvMemcpy, false, CopyDir::DeviceToDevice),
    memcpy_(136, "cuMemcpyHtoDAsync_v2", Driver, DrvMemcpy, true, CopyDir::HostToDevice),
    memcpy_(137, "cuMemcpyDtoHAsync_v2", Driver, DrvMemcpy, true, CopyDir::DeviceToHost),
    memcpy_(138, "cuMemcpyDtoDAsync_v2", Driver, DrvMemcpy, true, CopyDir::DeviceToDevice),
    memcpy_(139, "cuMemcpyHtoDAsync_v2_ptsz", Driver, DrvMemcpy, true, CopyDir::HostToDevice),
    memcpy_(140, "cuMemcpyDtoHAsync_v2_ptsz", Driver, DrvMemcpy, true, CopyDir::DeviceToHost),
    memcpy_(141, "cuMemcpyDtoDAsync_v2_ptsz", Driver, DrvMemcpy, true, CopyDir::DeviceToDevice),
    memcpy_(142, "cuMemcpy2D_v2", Driver, DrvMemcpy2D, false),
    memcpy_(143, "cuMemcpy2DAsync_v2", Driver, DrvMemcpy2D, true),
    memcpy_(144, "cuMemcpy2DUnaligned_v2", Driver, DrvMemcpy2D, false),
    memset_(150, "cuMemsetD8_v2", Driver, false, 1),
    memset_(151, "cuMemsetD32_v2", Driver, false, 4),
    memset_(152, "cuMemsetD8Async", Driver, true, 1),
    memset_(153, "cuMemsetD32Async", Driver, true, 4),
    sync(160, "cuStreamSynchronize", Driver, StreamArg),
    sync(161, "cuStreamSynchronize_ptsz", Driver, StreamArg),
    sync(162, "cuCtxSynchronize", Driver, NoArgs),
    sync(163, "cuEventSynchronize", Driver, StreamArg),
    named_lookup(170, "cuModuleGetFunction"),
    named_lookup(171, "cuLibraryGetKernel"),
    // No return probe: the function handle it writes is read at the thread's next launch (which
    // uses it) or lookup, one trap fewer for each of cuBLASLt's launches (bpf/events.h, bit 38).
    {172, "cuKernelGetFunction", Driver, KernelLookup, KernelGetFunction, false, -1, 0, false, 0},
});

}  // namespace

std::span<const FunctionSpec> all_functions() { return kFunctions; }

const FunctionSpec* function_by_id(uint16_t id) {
  static const auto* index = [] {
    auto* m = new std::unordered_map<uint16_t, const FunctionSpec*>;
    for (const auto& f : kFunctions) m->emplace(f.id, &f);
    return m;
  }();
  auto it = index->find(id);
  return it == index->end() ? nullptr : it->second;
}

const FunctionSpec* function_by_symbol(std::string_view symbol) {
  for (const auto& f : kFunctions)
    if (f.symbol == symbol) return &f;
  return nullptr;
}

uint64_t probe_cookie(const FunctionSpec& f) {
  uint64_t c = f.id;
  if (f.entry_deref_arg >= 0) {
    c |= uint64_t(f.entry_deref_arg + 1) << 16;
    c |= uint64_t(f.entry_deref_string ? 1 : 0) << 20;
    c |= uint64_t(f.entry_deref_len) << 24;
  }
  if (f.kind == KernelLookup) c |= uint64_t(1) << 21;
  if (f.kind == Launch) c |= uint64_t(1) << (f.api == Runtime ? 22 : 23);
  if (f.return_out_arg >= 0) c |= uint64_t(f.return_out_arg + 1) << 32;
  if (f.return_out_arg >= 0 && !f.has_return) c |= uint64_t(1) << 38;  // read at the next launch
  if (f.api == Runtime) c |= uint64_t(1) << 36;
  if (is_high_rate(f.kind)) c |= uint64_t(1) << 37;
  return c;
}

std::string_view to_string(Api a) { return a == Runtime ? "runtime" : "driver"; }

std::string_view to_string(CallKind k) {
  switch (k) {
    case Launch: return "launch";
    case GraphLaunch: return "graph_launch";
    case Alloc: return "alloc";
    case Free: return "free";
    case HostRegister: return "host_register";
    case HostUnregister: return "host_unregister";
    case Memcpy: return "memcpy";
    case Memset: return "memset";
    case Sync: return "sync";
    case KernelLookup: return "kernel_lookup";
  }
  return "?";
}

std::string_view to_string(CopyDir d) {
  switch (d) {
    case CopyDir::HostToHost: return "HtoH";
    case CopyDir::HostToDevice: return "HtoD";
    case CopyDir::DeviceToHost: return "DtoH";
    case CopyDir::DeviceToDevice: return "DtoD";
    case CopyDir::Default: return "default";
    case CopyDir::Unknown: return "unknown";
  }
  return "?";
}

std::string_view to_string(MemKind m) {
  switch (m) {
    case MemKind::None: return "";
    case MemKind::Device: return "device";
    case MemKind::Managed: return "managed";
    case MemKind::PinnedHost: return "pinned";
    case MemKind::RegisteredHost: return "registered";
  }
  return "?";
}

}  // namespace gpuscope::decode
