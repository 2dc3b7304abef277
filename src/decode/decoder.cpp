#include "decode/decoder.h"

#include <algorithm>
#include <cstring>

#include "decode/copies.h"
#include "decode/nccl.h"
#include "decode/entry_data.h"

namespace gpuscope::decode {
namespace {

uint32_t lo(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t hi(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

std::string deref_string(const gs_call_record& r) {
  if (!(r.flags & GS_CALL_DEREF_OK)) return {};
  const auto* s = reinterpret_cast<const char*>(r.deref);
  return std::string(s, strnlen(s, sizeof(r.deref)));
}

cuda::CopyDir runtime_kind(uint64_t kind) { return kind <= 4 ? static_cast<cuda::CopyDir>(kind) : cuda::CopyDir::Unknown; }

}  // namespace

const cuda::FunctionSpec* launch_api_function(uint16_t api) {
  static const char* const kSymbols[GS_LAUNCH_API_COUNT] = {
      nullptr,         "cuLaunchKernel",   "cuLaunchKernel_ptsz",       "cuLaunchKernelEx",
      "cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", "cuGraphLaunch",
      "cuGraphLaunch_ptsz",    "cuKernelGetFunction"};
  return api > 0 && api < GS_LAUNCH_API_COUNT ? cuda::function_by_symbol(kSymbols[api]) : nullptr;
}

bool decode_in_process_launch(const gs_launch_record& r, CallEvent& e) {
  const cuda::FunctionSpec* f = launch_api_function(r.api);
  if (!f) return false;
  e.func = f->id;
  e.ts_ns = r.ts_ns;
  e.duration_ns = r.duration_ns;
  e.has_return = true;
  e.ret = r.result;
  e.kernel_handle = r.function;
  if (f->sig == cuda::Signature::KernelGetFunction) {  // the kernel asked about, and its function
    e.out_handle = r.stream;
    e.out_valid = r.result == 0 && r.stream;
    return true;
  }
  e.stream = r.stream;
  if (f->kind == cuda::CallKind::Launch) {
    e.grid[0] = r.grid_x, e.grid[1] = r.grid_y, e.grid[2] = r.grid_z;
    e.block[0] = r.block_x, e.block[1] = r.block_y, e.block[2] = r.block_z;
    e.shared_mem = r.shared_mem;
  }
  return true;
}

bool decode_call(const gs_call_record& r, CallEvent& e, std::span<const uint8_t> deref_more) {
  const cuda::FunctionSpec* f = cuda::function_by_id(r.func);
  if (!f) return false;
  const __u64* a = r.args;
  const EntryData d(r, deref_more);

  e.ts_ns = r.ts_ns;
  e.duration_ns = r.duration_ns;
  e.pid = r.pid;
  e.tid = r.tid;
  e.func = r.func;
  e.has_return = r.flags & GS_CALL_HAS_RETURN;
  e.ret = e.has_return ? static_cast<int32_t>(r.ret) : 0;  // cudaError_t/CUresult are 32-bit
  e.py_stack = r.py_stack;
  e.comm.assign(r.comm, strnlen(r.comm, sizeof(r.comm)));
  // A communicator made without blocking (ncclInProgress, 7) is written before the call returns.
  const bool succeeded = e.ret == 0 || (f->api == cuda::Api::Nccl && e.ret == 7);
  e.out_valid = (r.flags & GS_CALL_OUT_OK) && succeeded;
  if (e.out_valid) e.out_handle = r.out_value;
  e.out_unchecked = r.flags & GS_CALL_OUT_LATER;
  e.under_runtime = r.flags & GS_CALL_UNDER_RUNTIME;

  if (decode_copy_family(*f, a, d, e)) return true;
  if (decode_nccl(*f, a, d, e)) return true;
  switch (f->sig) {
    case cuda::Signature::RtLaunch:
      e.kernel_handle = a[0];
      e.grid[0] = lo(a[1]), e.grid[1] = hi(a[1]), e.grid[2] = lo(a[2]);
      e.block[0] = lo(a[3]), e.block[1] = hi(a[3]), e.block[2] = lo(a[4]);
      e.shared_mem = lo(a[6]);
      e.stream = a[7];
      break;
    case cuda::Signature::RtLaunchExC:
    case cuda::Signature::DrvLaunchEx:
      e.kernel_handle = a[1];
      for (int i = 0; i < 3; ++i) {
        e.grid[i] = d.get<uint32_t>(4 * i);
        e.block[i] = d.get<uint32_t>(12 + 4 * i);
      }
      e.shared_mem = d.get<uint32_t>(24);
      e.stream = d.get<uint64_t>(32);
      break;
    case cuda::Signature::DrvLaunch:
      e.kernel_handle = a[0];
      e.grid[0] = lo(a[1]), e.grid[1] = lo(a[2]), e.grid[2] = lo(a[3]);
      e.block[0] = lo(a[4]), e.block[1] = lo(a[5]), e.block[2] = lo(a[6]);
      e.shared_mem = lo(a[7]);
      e.stream = a[8];
      break;
    case cuda::Signature::GraphArgs:
      e.kernel_handle = a[0];
      e.stream = a[1];
      break;
    case cuda::Signature::InProcessLaunch:
      // The launch as the hooks recorded it, at its own time; the stack (walked at this probe)
      // stands for N launches, N the hooks' (the rest are in the ring, left out).
      if (!d.ok() || !decode_in_process_launch(d.get_struct<gs_launch_record>(), e)) return false;
      e.stack_weight = std::max<uint32_t>(uint32_t(a[1]), 1);
      break;
    case cuda::Signature::AllocOut:
      e.bytes = a[1];
      if (f->async) e.stream = a[2];
      if (e.out_valid) e.ptr = e.out_handle;
      break;
    case cuda::Signature::RegisterArgs:
      e.ptr = a[0];
      e.bytes = a[1];
      break;
    case cuda::Signature::PtrOnly:
      e.ptr = a[0];
      if (f->async) e.stream = a[1];
      break;
    case cuda::Signature::RtMemcpy:
      e.ptr = a[0], e.src = a[1], e.bytes = a[2];
      e.dir = runtime_kind(a[3]);
      if (f->async) e.stream = a[4];
      break;
    case cuda::Signature::RtMemcpy2D:
      e.ptr = a[0], e.src = a[2];
      e.bytes = a[4] * a[5];
      e.dir = runtime_kind(a[6]);
      if (f->async) e.stream = a[7];
      break;
    case cuda::Signature::DrvMemcpy:
      e.ptr = a[0], e.src = a[1], e.bytes = a[2];
      e.dir = f->fixed_dir;
      if (f->async) e.stream = a[3];
      break;
    case cuda::Signature::MemsetArgs:
      e.ptr = a[0];
      e.bytes = a[2] * f->elem_size;
      if (f->async) e.stream = a[3];
      break;
    case cuda::Signature::StreamArg:
      e.stream = a[0];
      break;
    case cuda::Signature::NoArgs:
      break;
    case cuda::Signature::RegisterFunction:
    case cuda::Signature::NamedLookup:
      e.kernel_handle = a[1];
      e.name = deref_string(r);
      // Not copied, or cut at the copy's size (C++ template kernels run to kilobytes): user
      // space reads it whole from the process.
      if (e.name.empty() || e.name.size() >= sizeof(r.deref) - 1) e.name_addr = a[2];
      break;
    case cuda::Signature::KernelGetFunction:
      e.kernel_handle = a[1];
      break;
    case cuda::Signature::GlobalLookup:
      // The address and the size it wrote, read at return (the size as the entry data; not read
      // where its pointer was NULL, which the API allows).
      if (e.out_valid) e.ptr = e.out_handle;
      e.bytes = d.get<uint64_t>(0);
      e.bytes_known = d.ok();
      e.kernel_handle = a[2];  // the module or library, as lookups record their parent
      break;
    default:  // the copy family's, above
      break;
  }
  return true;
}

}  // namespace gpuscope::decode
