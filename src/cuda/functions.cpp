#include "cuda/functions.h"

#include <algorithm>
#include <array>

#include "events.h"

namespace gpuscope::cuda {
namespace {

constexpr uint8_t kLaunchConfigLen = 56;  // cudaLaunchConfig_t and CUlaunchConfig up to numAttrs
constexpr uint8_t kMemcpy2DLen = 128;     // CUDA_MEMCPY2D
// Longer than GS_DEREF_LEN: their records are gs_call_record_long (bpf/events.h).
constexpr uint8_t kRtMemcpy3DLen = 160;      // cudaMemcpy3DParms, through kind
constexpr uint8_t kRtMemcpy3DPeerLen = 168;  // cudaMemcpy3DPeerParms
constexpr uint8_t kDrvMemcpy3DLen = 200;     // CUDA_MEMCPY3D, CUDA_MEMCPY3D_PEER
// Array descriptors: cudaChannelFormatDesc, CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR.
constexpr uint8_t kChannelDescLen = 20;
constexpr uint8_t kArrayDescLen = 24;
constexpr uint8_t kArray3DDescLen = 40;
static_assert(kDrvMemcpy3DLen <= GS_DEREF_LONG_LEN);

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
  auto deref = [&](int8_t arg, uint8_t len) {
    f.entry_deref_arg = arg;
    f.entry_deref_len = len;
  };
  switch (sig) {
    case DrvMemcpy2D: deref(0, kMemcpy2DLen); break;
    case RtMemcpy3D: deref(0, kRtMemcpy3DLen); break;
    case RtMemcpy3DPeer: deref(0, kRtMemcpy3DPeerLen); break;
    case DrvMemcpy3D: deref(0, kDrvMemcpy3DLen); break;
    case Memcpy3DBatch:
    case Memcpy3DBatchFailIdx: f.batch_3d_ops = true; break;
    case MemcpyBatch:
    case MemcpyBatchFailIdx: f.batch_sizes = true; break;
    default: break;
  }
  return f;
}
constexpr FunctionSpec array_create(uint16_t id, std::string_view sym, Api api, Signature sig, MemKind mem) {
  FunctionSpec f{id, sym, api, ArrayCreate, sig, true};
  f.return_out_arg = 0;
  f.mem = mem;
  switch (sig) {
    case RtArrayAlloc:
    case RtArray3DAlloc: f.entry_deref_arg = 1, f.entry_deref_len = kChannelDescLen; break;
    case DrvArrayCreate: f.entry_deref_arg = 1, f.entry_deref_len = kArrayDescLen; break;
    case DrvArray3DCreate: f.entry_deref_arg = 1, f.entry_deref_len = kArray3DDescLen; break;
    default: break;  // MipmapLevel: the level has its mipmapped array's format
  }
  return f;
}
constexpr FunctionSpec array_destroy(uint16_t id, std::string_view sym, Api api, MemKind mem) {
  FunctionSpec f{id, sym, api, ArrayDestroy, PtrOnly, true};
  f.mem = mem;
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
constexpr FunctionSpec global_lookup(uint16_t id, std::string_view sym, MemKind mem) {
  FunctionSpec f{id, sym, Driver, SymbolLookup, GlobalLookup, true};
  f.return_out_arg = 0;
  f.return_out_size = true;
  f.mem = mem;
  return f;
}
constexpr FunctionSpec named_lookup(uint16_t id, std::string_view sym) {
  FunctionSpec f{id, sym, Driver, KernelLookup, NamedLookup, true};
  f.entry_deref_arg = 2;
  f.entry_deref_len = GS_DEREF_LEN;
  f.entry_deref_string = true;
  f.return_out_arg = 0;
  return f;
}

// NCCL's API. Collectives, sends, receives and groups are probed at entry only: one trap a call
// (a return probe doubles it, 0.75 against 1.34 us on the H100). Their kernels are tied to them
// by thread and order (report/nccl_collectives.cpp); their results and enqueue times are not
// seen. Communicators' making and ending are probed at their return too: the handle made, and
// whether it was.
constexpr uint8_t kNcclIdRead = 32;  // of an ncclUniqueId: the bootstrap's magic and address
constexpr FunctionSpec nccl(uint16_t id, std::string_view sym, CallKind kind, Signature sig) {
  FunctionSpec f{id, sym, Nccl, kind, sig, kind == CommInit || kind == CommEnd};
  if (sig == NcclCommInitRank) f.return_out_arg = 0;
  if (sig == NcclCommInitScalable) {
    f.return_out_arg = 0;
    f.entry_deref_arg = 4;
    f.entry_deref_len = kNcclIdRead;
  }
  if (sig == NcclCommSplit) f.return_out_arg = 3;
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
    // In libgpuscope_launches.so, not CUDA: its calls are recorded as the launches they carry.
    {107, "gpuscope_launch_stack", Driver, Launch, InProcessLaunch, false, 0, 64},
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
    {172, "cuKernelGetFunction", Driver, KernelLookup, KernelGetFunction, false, -1, 0, false, false, false, 0},

    // The rest of the copy family (issue 29). Runtime copies' ids stay below kRetiringIds.
    memcpy_(180, "cudaMemcpy3D", Runtime, RtMemcpy3D, false),
    memcpy_(181, "cudaMemcpy3D_ptds", Runtime, RtMemcpy3D, false),
    memcpy_(182, "cudaMemcpy3DAsync", Runtime, RtMemcpy3D, true),
    memcpy_(183, "cudaMemcpy3DAsync_ptsz", Runtime, RtMemcpy3D, true),
    memcpy_(184, "cudaMemcpy3DPeer", Runtime, RtMemcpy3DPeer, false, CopyDir::DeviceToDevice),
    memcpy_(185, "cudaMemcpy3DPeer_ptds", Runtime, RtMemcpy3DPeer, false, CopyDir::DeviceToDevice),
    memcpy_(186, "cudaMemcpy3DPeerAsync", Runtime, RtMemcpy3DPeer, true, CopyDir::DeviceToDevice),
    memcpy_(187, "cudaMemcpy3DPeerAsync_ptsz", Runtime, RtMemcpy3DPeer, true, CopyDir::DeviceToDevice),
    memcpy_(188, "cudaMemcpyPeer", Runtime, MemcpyPairs, false, CopyDir::DeviceToDevice),
    memcpy_(189, "cudaMemcpyPeerAsync", Runtime, MemcpyPairs, true, CopyDir::DeviceToDevice),
    memcpy_(190, "cudaMemcpy2DToArray", Runtime, RtMemcpy2DToArray, false),
    memcpy_(191, "cudaMemcpy2DToArray_ptds", Runtime, RtMemcpy2DToArray, false),
    memcpy_(192, "cudaMemcpy2DToArrayAsync", Runtime, RtMemcpy2DToArray, true),
    memcpy_(193, "cudaMemcpy2DToArrayAsync_ptsz", Runtime, RtMemcpy2DToArray, true),
    memcpy_(194, "cudaMemcpy2DFromArray", Runtime, RtMemcpy2DFromArray, false),
    memcpy_(195, "cudaMemcpy2DFromArray_ptds", Runtime, RtMemcpy2DFromArray, false),
    memcpy_(196, "cudaMemcpy2DFromArrayAsync", Runtime, RtMemcpy2DFromArray, true),
    memcpy_(197, "cudaMemcpy2DFromArrayAsync_ptsz", Runtime, RtMemcpy2DFromArray, true),
    memcpy_(198, "cudaMemcpy2DArrayToArray", Runtime, RtMemcpy2DArrayToArray, false, CopyDir::DeviceToDevice),
    memcpy_(199, "cudaMemcpy2DArrayToArray_ptds", Runtime, RtMemcpy2DArrayToArray, false, CopyDir::DeviceToDevice),
    memcpy_(200, "cudaMemcpyToArray", Runtime, RtMemcpyToArray, false),
    memcpy_(201, "cudaMemcpyToArray_ptds", Runtime, RtMemcpyToArray, false),
    memcpy_(202, "cudaMemcpyToArrayAsync", Runtime, RtMemcpyToArray, true),
    memcpy_(203, "cudaMemcpyToArrayAsync_ptsz", Runtime, RtMemcpyToArray, true),
    memcpy_(204, "cudaMemcpyFromArray", Runtime, RtMemcpyFromArray, false),
    memcpy_(205, "cudaMemcpyFromArray_ptds", Runtime, RtMemcpyFromArray, false),
    memcpy_(206, "cudaMemcpyFromArrayAsync", Runtime, RtMemcpyFromArray, true),
    memcpy_(207, "cudaMemcpyFromArrayAsync_ptsz", Runtime, RtMemcpyFromArray, true),
    memcpy_(208, "cudaMemcpyArrayToArray", Runtime, RtMemcpyArrayToArray, false, CopyDir::DeviceToDevice),
    memcpy_(209, "cudaMemcpyArrayToArray_ptds", Runtime, RtMemcpyArrayToArray, false, CopyDir::DeviceToDevice),
    memcpy_(210, "cudaMemcpyToSymbol", Runtime, RtMemcpyToSymbol, false),
    memcpy_(211, "cudaMemcpyToSymbol_ptds", Runtime, RtMemcpyToSymbol, false),
    memcpy_(212, "cudaMemcpyToSymbolAsync", Runtime, RtMemcpyToSymbol, true),
    memcpy_(213, "cudaMemcpyToSymbolAsync_ptsz", Runtime, RtMemcpyToSymbol, true),
    memcpy_(214, "cudaMemcpyFromSymbol", Runtime, RtMemcpyFromSymbol, false),
    memcpy_(215, "cudaMemcpyFromSymbol_ptds", Runtime, RtMemcpyFromSymbol, false),
    memcpy_(216, "cudaMemcpyFromSymbolAsync", Runtime, RtMemcpyFromSymbol, true),
    memcpy_(217, "cudaMemcpyFromSymbolAsync_ptsz", Runtime, RtMemcpyFromSymbol, true),
    // libcudart.so.12 (12.8, 12.9) exports these names with a failIdx argument before the
    // stream: its batch copies' stream is not known (see docs/record-format.md).
    memcpy_(218, "cudaMemcpyBatchAsync", Runtime, MemcpyBatch, true),
    memcpy_(219, "cudaMemcpyBatchAsync_ptsz", Runtime, MemcpyBatch, true),
    memcpy_(220, "cudaMemcpy3DBatchAsync", Runtime, Memcpy3DBatch, true),
    memcpy_(221, "cudaMemcpy3DBatchAsync_ptsz", Runtime, Memcpy3DBatch, true),
    array_create(230, "cudaMallocArray", Runtime, RtArrayAlloc, MemKind::Array),
    array_create(231, "cudaMalloc3DArray", Runtime, RtArray3DAlloc, MemKind::Array),
    array_create(232, "cudaMallocMipmappedArray", Runtime, RtArray3DAlloc, MemKind::MipmappedArray),
    array_create(233, "cudaGetMipmappedArrayLevel", Runtime, MipmapLevel, MemKind::Array),
    array_destroy(234, "cudaFreeArray", Runtime, MemKind::Array),
    array_destroy(235, "cudaFreeMipmappedArray", Runtime, MemKind::MipmappedArray),

    memcpy_(260, "cuMemcpy3D_v2", Driver, DrvMemcpy3D, false),
    memcpy_(261, "cuMemcpy3D_v2_ptds", Driver, DrvMemcpy3D, false),
    memcpy_(262, "cuMemcpy3DAsync_v2", Driver, DrvMemcpy3D, true),
    memcpy_(263, "cuMemcpy3DAsync_v2_ptsz", Driver, DrvMemcpy3D, true),
    memcpy_(264, "cuMemcpy3DPeer", Driver, DrvMemcpy3D, false),
    memcpy_(265, "cuMemcpy3DPeer_ptds", Driver, DrvMemcpy3D, false),
    memcpy_(266, "cuMemcpy3DPeerAsync", Driver, DrvMemcpy3D, true),
    memcpy_(267, "cuMemcpy3DPeerAsync_ptsz", Driver, DrvMemcpy3D, true),
    memcpy_(268, "cuMemcpyPeer", Driver, MemcpyPairs, false, CopyDir::DeviceToDevice),
    memcpy_(269, "cuMemcpyPeer_ptds", Driver, MemcpyPairs, false, CopyDir::DeviceToDevice),
    memcpy_(270, "cuMemcpyPeerAsync", Driver, MemcpyPairs, true, CopyDir::DeviceToDevice),
    memcpy_(271, "cuMemcpyPeerAsync_ptsz", Driver, MemcpyPairs, true, CopyDir::DeviceToDevice),
    memcpy_(272, "cuMemcpyHtoA_v2", Driver, DrvMemcpyToArray, false, CopyDir::HostToDevice),
    memcpy_(273, "cuMemcpyHtoA_v2_ptds", Driver, DrvMemcpyToArray, false, CopyDir::HostToDevice),
    memcpy_(274, "cuMemcpyHtoAAsync_v2", Driver, DrvMemcpyToArray, true, CopyDir::HostToDevice),
    memcpy_(275, "cuMemcpyHtoAAsync_v2_ptsz", Driver, DrvMemcpyToArray, true, CopyDir::HostToDevice),
    memcpy_(276, "cuMemcpyAtoH_v2", Driver, DrvMemcpyFromArray, false, CopyDir::DeviceToHost),
    memcpy_(277, "cuMemcpyAtoH_v2_ptds", Driver, DrvMemcpyFromArray, false, CopyDir::DeviceToHost),
    memcpy_(278, "cuMemcpyAtoHAsync_v2", Driver, DrvMemcpyFromArray, true, CopyDir::DeviceToHost),
    memcpy_(279, "cuMemcpyAtoHAsync_v2_ptsz", Driver, DrvMemcpyFromArray, true, CopyDir::DeviceToHost),
    memcpy_(280, "cuMemcpyDtoA_v2", Driver, DrvMemcpyToArray, false, CopyDir::DeviceToDevice),
    memcpy_(281, "cuMemcpyDtoA_v2_ptds", Driver, DrvMemcpyToArray, false, CopyDir::DeviceToDevice),
    memcpy_(282, "cuMemcpyAtoD_v2", Driver, DrvMemcpyFromArray, false, CopyDir::DeviceToDevice),
    memcpy_(283, "cuMemcpyAtoD_v2_ptds", Driver, DrvMemcpyFromArray, false, CopyDir::DeviceToDevice),
    memcpy_(284, "cuMemcpyAtoA_v2", Driver, MemcpyPairs, false, CopyDir::DeviceToDevice),
    memcpy_(285, "cuMemcpyAtoA_v2_ptds", Driver, MemcpyPairs, false, CopyDir::DeviceToDevice),
    // The unsuffixed names keep CUDA 12.8's signature (failIdx); cuda.h maps to the _v2 ones.
    memcpy_(286, "cuMemcpyBatchAsync", Driver, MemcpyBatchFailIdx, true),
    memcpy_(287, "cuMemcpyBatchAsync_ptsz", Driver, MemcpyBatchFailIdx, true),
    memcpy_(288, "cuMemcpyBatchAsync_v2", Driver, MemcpyBatch, true),
    memcpy_(289, "cuMemcpyBatchAsync_v2_ptsz", Driver, MemcpyBatch, true),
    memcpy_(290, "cuMemcpy3DBatchAsync", Driver, Memcpy3DBatchFailIdx, true),
    memcpy_(291, "cuMemcpy3DBatchAsync_ptsz", Driver, Memcpy3DBatchFailIdx, true),
    memcpy_(292, "cuMemcpy3DBatchAsync_v2", Driver, Memcpy3DBatch, true),
    memcpy_(293, "cuMemcpy3DBatchAsync_v2_ptsz", Driver, Memcpy3DBatch, true),
    // Per-thread default stream forms of copies above (CUDA_API_PER_THREAD_DEFAULT_STREAM).
    memcpy_(294, "cuMemcpy_ptds", Driver, DrvMemcpy, false, CopyDir::Default),
    memcpy_(295, "cuMemcpyHtoD_v2_ptds", Driver, DrvMemcpy, false, CopyDir::HostToDevice),
    memcpy_(296, "cuMemcpyDtoH_v2_ptds", Driver, DrvMemcpy, false, CopyDir::DeviceToHost),
    memcpy_(297, "cuMemcpyDtoD_v2_ptds", Driver, DrvMemcpy, false, CopyDir::DeviceToDevice),
    memcpy_(298, "cuMemcpy2D_v2_ptds", Driver, DrvMemcpy2D, false),
    memcpy_(299, "cuMemcpy2DUnaligned_v2_ptds", Driver, DrvMemcpy2D, false),
    memcpy_(300, "cuMemcpy2DAsync_v2_ptsz", Driver, DrvMemcpy2D, true),
    array_create(310, "cuArrayCreate_v2", Driver, DrvArrayCreate, MemKind::Array),
    array_create(311, "cuArray3DCreate_v2", Driver, DrvArray3DCreate, MemKind::Array),
    array_create(312, "cuMipmappedArrayCreate", Driver, DrvArray3DCreate, MemKind::MipmappedArray),
    array_create(313, "cuMipmappedArrayGetLevel", Driver, MipmapLevel, MemKind::Array),
    array_destroy(314, "cuArrayDestroy", Driver, MemKind::Array),
    array_destroy(315, "cuMipmappedArrayDestroy", Driver, MemKind::MipmappedArray),
    // Module globals: libcudart looks a symbol up through these (cudaMemcpyToSymbol, cudaGetSymbolAddress).
    global_lookup(316, "cuModuleGetGlobal_v2", MemKind::Device),
    global_lookup(317, "cuLibraryGetGlobal", MemKind::Device),
    global_lookup(318, "cuLibraryGetManaged", MemKind::Managed),
    // NCCL exports each function twice at one address (ncclX weak, pncclX strong): the first
    // name of an address is probed, once.
    nccl(400, "ncclAllReduce", Collective, NcclReduce),
    nccl(401, "ncclReduceScatter", Collective, NcclReduce),
    nccl(402, "ncclAllGather", Collective, NcclGather),
    nccl(403, "ncclAlltoAll", Collective, NcclGather),
    nccl(404, "ncclBroadcast", Collective, NcclRooted),
    nccl(405, "ncclBcast", Collective, NcclPeer),  // (buf, count, datatype, root, comm, stream)
    nccl(406, "ncclReduce", Collective, NcclReduceRooted),
    nccl(407, "ncclSend", PeerToPeer, NcclPeer),
    nccl(408, "ncclRecv", PeerToPeer, NcclPeer),
    nccl(409, "ncclGroupStart", Group, NoArgs),
    nccl(410, "ncclGroupEnd", Group, NoArgs),
    nccl(411, "ncclCommInitRank", CommInit, NcclCommInitRank),
    nccl(412, "ncclCommInitRankConfig", CommInit, NcclCommInitRank),
    nccl(413, "ncclCommInitRankScalable", CommInit, NcclCommInitScalable),
    nccl(414, "ncclCommSplit", CommInit, NcclCommSplit),
    nccl(415, "ncclCommDestroy", CommEnd, NcclComm),
    nccl(416, "ncclCommAbort", CommEnd, NcclComm),
    nccl(417, "ncclCommFinalize", CommEnd, NcclComm),
});

constexpr bool retiring_ids_fit() {
  for (const auto& f : kFunctions)
    if (may_be_recorded_by_driver(f) && f.id >= kRetiringIds) return false;
  return true;
}
static_assert(retiring_ids_fit(), "a runtime function the driver may record needs an id below kRetiringIds");
constexpr bool long_entries_have_returns() {
  for (const auto& f : kFunctions)
    if (f.entry_deref_len > GS_DEREF_LEN && (!f.has_return || f.entry_deref_string)) return false;
  return true;
}
static_assert(long_entries_have_returns(), "entry data past GS_DEREF_LEN needs a return probe (call_return sends it)");
constexpr bool sizes_out_have_no_entry_data() {
  for (const auto& f : kFunctions)
    if (f.return_out_size && (!f.has_return || f.return_out_arg < 0 || f.entry_deref_arg >= 0)) return false;
  return true;
}
static_assert(sizes_out_have_no_entry_data(), "a size read at return is the entry data: a return probe, no entry dereference");

}  // namespace

std::span<const FunctionSpec> all_functions() { return kFunctions; }

namespace {

constexpr uint16_t kMaxId = [] {
  uint16_t m = 0;
  for (const auto& f : kFunctions) m = std::max(m, f.id);
  return m;
}();

// By id, a table: looked up for every call the agent and the recorder read.
constexpr auto kById = [] {
  std::array<const FunctionSpec*, kMaxId + 1> t{};
  for (const auto& f : kFunctions) t[f.id] = &f;
  return t;
}();
static_assert([] {
  size_t listed = 0;
  for (const auto* f : kById) listed += f != nullptr;
  return listed == kFunctions.size();
}(), "two functions with one id");

}  // namespace

const FunctionSpec* function_by_id(uint16_t id) { return id <= kMaxId ? kById[id] : nullptr; }

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
  const bool in_process = f.sig == InProcessLaunch;
  if (f.kind == Launch && !in_process) c |= uint64_t(1) << (f.api == Runtime ? 22 : 23);
  if (f.return_out_arg >= 0) c |= uint64_t(f.return_out_arg + 1) << 32;
  if (f.return_out_arg >= 0 && !f.has_return) c |= uint64_t(1) << 38;  // read at the next launch
  if (f.batch_sizes) c |= uint64_t(1) << 39;
  if (f.batch_3d_ops) c |= uint64_t(1) << 40;
  if (f.return_out_size) c |= uint64_t(1) << 41;
  if (f.api == Runtime) c |= uint64_t(1) << 36;
  // The hooks chose the launch's stack already: always walked, not sampled again; charged.
  if (is_high_rate(f.kind)) c |= uint64_t(1) << (in_process ? 42 : 37);
  return c;
}

std::string_view to_string(Api a) {
  switch (a) {
    case Runtime: return "runtime";
    case Driver: return "driver";
    case Nccl: return "nccl";
  }
  return "?";
}

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
    case ArrayCreate: return "array_create";
    case ArrayDestroy: return "array_destroy";
    case SymbolLookup: return "symbol_lookup";
    case Collective: return "collective";
    case PeerToPeer: return "p2p";
    case Group: return "group";
    case CommInit: return "comm_init";
    case CommEnd: return "comm_end";
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
    case MemKind::Array: return "array";
    case MemKind::MipmappedArray: return "mipmapped_array";
  }
  return "?";
}

}  // namespace gpuscope::cuda
