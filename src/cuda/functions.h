// The probed CUDA API (and NCCL's, which CUDA programs call beside it): one row per symbol, with
// how to probe it and how to read its arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace gpuscope::cuda {

enum class Api : uint8_t { Runtime, Driver, Nccl };

enum class CallKind : uint8_t {
  Launch,        // a kernel launch
  GraphLaunch,
  Alloc,         // device, managed or pinned-host allocation
  Free,
  HostRegister,
  HostUnregister,
  Memcpy,
  Memset,
  Sync,          // a call that waits on the GPU
  KernelLookup,  // names a kernel handle (driver) or a host stub (runtime registration)
  // CUDA arrays (textures, surfaces), created or destroyed: tracked so that a copy whose extent
  // is in the array's elements (cudaMemcpy3D) gets its bytes. Not counted as device memory.
  ArrayCreate,   // an array or mipmapped array created, or a mipmapped array's level looked up
  ArrayDestroy,
  // A module's global variable looked up (__device__, __constant__, __managed__; the runtime
  // looks up a symbol's address so): its device address and size, tracked as device memory so
  // that a copy the direction of which comes from its pointers (cudaMemcpyDefault, cuMemcpy)
  // knows it. Not counted as device memory allocated.
  SymbolLookup,
  // NCCL (Api::Nccl): a collective or a send/receive, enqueued on a stream (its kernel runs later,
  // at ncclGroupEnd inside a group); a group's start or end; a communicator made or ended.
  Collective,
  PeerToPeer,
  Group,
  CommInit,
  CommEnd,
};

// How the raw argument words of a call are laid out; one decoder per signature.
enum class Signature : uint8_t {
  RtLaunch,         // (func, dim3 grid, dim3 block, args, shmem, stream)
  RtLaunchExC,      // (const cudaLaunchConfig_t*, func, args)
  DrvLaunch,        // (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)
  DrvLaunchEx,      // (const CUlaunchConfig*, f, params, extra)
  GraphArgs,        // (exec, stream)
  AllocOut,         // (T** out, size, ...)            stream at arg 2 for the async forms
  RegisterArgs,     // (ptr, size, flags)
  PtrOnly,          // (ptr, ...)                       frees, unregister
  RtMemcpy,         // (dst, src, count, kind, [stream])
  RtMemcpy2D,       // (dst, dpitch, src, spitch, width, height, kind, [stream])
  DrvMemcpy,        // (dst, src, bytes, [stream])      direction fixed by the function
  DrvMemcpy2D,      // (const CUDA_MEMCPY2D*, [stream])
  // The rest of the copy family. Arrays are device memory; a runtime copy's cudaMemcpyKind is
  // corrected for them as the runtime does.
  RtMemcpy3D,             // (const cudaMemcpy3DParms*, [stream])       extent in the array's elements
  RtMemcpy3DPeer,         // (const cudaMemcpy3DPeerParms*, [stream])   likewise
  RtMemcpyToArray,        // (dstArray, wOffset, hOffset, src, count, kind, [stream])
  RtMemcpyFromArray,      // (dst, srcArray, wOffset, hOffset, count, kind, [stream])
  RtMemcpyArrayToArray,   // (dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count, kind)
  RtMemcpy2DToArray,      // (dstArray, wOffset, hOffset, src, spitch, width, height, kind, [stream])
  RtMemcpy2DFromArray,    // (dst, dpitch, srcArray, wOffset, hOffset, width, height, kind, [stream])
  RtMemcpy2DArrayToArray, // (dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width, height, kind)
  RtMemcpyToSymbol,       // (symbol, src, count, offset, kind, [stream])
  RtMemcpyFromSymbol,     // (dst, symbol, count, offset, kind, [stream])
  MemcpyPairs,            // (dst, dstDevice|dstContext|dstOffset, src, srcDevice|..., bytes, [stream]):
                          // cudaMemcpyPeer, cuMemcpyPeer, cuMemcpyAtoA_v2
  DrvMemcpy3D,            // (const CUDA_MEMCPY3D* or CUDA_MEMCPY3D_PEER*, [stream]): same offsets
  DrvMemcpyToArray,       // (dstArray, dstOffset, src, bytes, [stream])
  DrvMemcpyFromArray,     // (dst, srcArray, srcOffset, bytes, [stream])
  MemcpyBatch,            // (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, stream): sizes summed in BPF
  MemcpyBatchFailIdx,     // CUDA 12.8's: (..., numAttrs, failIdx, stream)
  Memcpy3DBatch,          // (numOps, opList, flags, stream): operations read in BPF
  Memcpy3DBatchFailIdx,   // CUDA 12.8's: (numOps, opList, failIdx, flags, stream)
  RtArrayAlloc,           // cudaMallocArray(out, const cudaChannelFormatDesc*, width, height, flags)
  RtArray3DAlloc,         // (out, const cudaChannelFormatDesc*, cudaExtent (on the stack), ...)
  DrvArrayCreate,         // cuArrayCreate_v2(out, const CUDA_ARRAY_DESCRIPTOR*)
  DrvArray3DCreate,       // (out, const CUDA_ARRAY3D_DESCRIPTOR*, ...)
  MipmapLevel,            // (array* out, mipmapped array, level)
  MemsetArgs,       // (ptr, value, count, [stream])    count in elements of elem_size
  StreamArg,        // (stream, ...)
  NoArgs,
  RegisterFunction, // __cudaRegisterFunction(handle, hostFun, deviceFun, deviceName, ...)
  NamedLookup,      // (Handle* out, parent, const char* name)
  KernelGetFunction,// (CUfunction* out, CUkernel)
  GlobalLookup,     // (CUdeviceptr* dptr, size_t* bytes, module or library, name): both read at return
  // gpuscope_launch_stack(const gs_launch_record*, N): a launch the in-process hooks made, handed
  // to a probe for its stack (1 in N, N its weight); the record is copied at entry
  // (inject/launch_ring.h, record --launch-probes in-process).
  InProcessLaunch,
  // NCCL's (x86-64: the seventh argument and on are on the stack).
  NcclReduce,       // (send, recv, count, datatype, op, comm, stream): AllReduce, ReduceScatter
  NcclGather,       // (send, recv, count, datatype, comm, stream): AllGather, AlltoAll
  NcclRooted,       // (send, recv, count, datatype, root, comm, stream): Broadcast
  NcclReduceRooted, // (send, recv, count, datatype, op, root, comm, stream): Reduce
  NcclPeer,         // (buf, count, datatype, peer, comm, stream): Send, Recv
  // (ncclComm_t* out, nranks, rank, [config]) with the 128-byte ncclUniqueId passed by value on
  // the stack (its first 32 bytes read as arguments 6-9: the bootstrap's random magic and address,
  // which every rank of the communicator was given): CommInitRank, CommInitRankConfig
  NcclCommInitRank,
  NcclCommInitScalable,  // (ncclComm_t* out, nranks, rank, nIds, ncclUniqueId* ids, config): the first id read at entry
  NcclCommSplit,    // (comm, color, key, ncclComm_t* out, config)
  NcclComm,         // (comm): Destroy, Abort, Finalize
};

// Direction of a copy, as cudaMemcpyKind numbers it.
enum class CopyDir : uint8_t { HostToHost = 0, HostToDevice = 1, DeviceToHost = 2, DeviceToDevice = 3, Default = 4, Unknown = 5 };

enum class MemKind : uint8_t { None, Device, Managed, PinnedHost, RegisteredHost, Array, MipmappedArray };

struct FunctionSpec {
  uint16_t id;
  std::string_view symbol;
  Api api;
  CallKind kind;
  Signature sig;
  bool has_return;               // false: entry probe only (launches: one trap per call)
  int8_t entry_deref_arg = -1;   // argument whose pointee is copied at entry
  // Bytes copied: up to GS_DEREF_LEN, or up to 255 for a function with a return probe, whose
  // records then carry the rest in a longer record (gs_call_record_long; 3-D copy descriptors).
  uint8_t entry_deref_len = 0;
  bool entry_deref_string = false;
  bool batch_sizes = false;      // a batch copy: its sizes summed at entry (gs_batch_entry)
  bool batch_3d_ops = false;     // a 3-D batch copy: its operations read at entry (gs_batch3d_entry)
  int8_t return_out_arg = -1;    // out-pointer read at return
  bool return_out_size = false;  // the argument after it is a second one (a size), read at return as the entry data
  bool async = false;            // takes a stream argument after the fixed ones
  CopyDir fixed_dir = CopyDir::Unknown;  // driver copies name their direction
  MemKind mem = MemKind::None;   // what an allocation or free is of
  uint8_t elem_size = 1;         // memset element size
};


std::span<const FunctionSpec> all_functions();
const FunctionSpec* function_by_id(uint16_t id);
const FunctionSpec* function_by_symbol(std::string_view symbol);
// The cookie a uprobe on this function carries (bpf/events.h explains the bits).
uint64_t probe_cookie(const FunctionSpec& f);
// Calls a program may make thousands of times a second (launches, copies, memsets): the
// probes an overhead budget switches off first.
constexpr bool is_high_rate(CallKind k) {
  return k == CallKind::Launch || k == CallKind::GraphLaunch || k == CallKind::Memcpy || k == CallKind::Memset;
}
// ...and cuKernelGetFunction: cuBLASLt asks for a kernel's function before each of its launches
// (on the H100, 34 calls in a training step of ~270 launches: 2.7k calls/s, whose always-on
// probe alone cost the job 1.9% of its CPU against a 1% budget). Each launch's lookup comes
// just before it, so the lookups of the launches observed are observed too.
constexpr bool is_high_rate(const FunctionSpec& f) {
  return is_high_rate(f.kind) || f.sig == Signature::KernelGetFunction;
}
// Runtime calls whose row a driver call made inside them carries whole (bytes, pointers,
// stream, direction, duration, result): once a recording has seen that a runtime function's
// calls all make one, its probes may go (decode::Tracker::take_redundant_runtime_functions).
// Not launches: the runtime names kernels that were loaded before gpuscope came. Nor
// allocations and frees: a few a step at most, and a stack walked by frame pointers from the
// driver's entry stops in the runtime (no frame pointers there), before the library that
// allocated, which says whose the memory in use is.
constexpr bool may_be_recorded_by_driver(const FunctionSpec& f) {
  return f.api == Api::Runtime && f.has_return &&
         (f.kind == CallKind::Memcpy || f.kind == CallKind::Memset || f.kind == CallKind::Sync);
}
// The BPF side marks functions whose probes are being removed in a bitmap of this many ids
// (retiring_funcs): every function may_be_recorded_by_driver has an id below it.
inline constexpr uint16_t kRetiringIds = 256;
std::string_view to_string(Api);
std::string_view to_string(CallKind);
std::string_view to_string(CopyDir);
std::string_view to_string(MemKind);

}  // namespace gpuscope::cuda
