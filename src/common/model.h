// The event model every stage speaks: decode produces it, store writes it, report reads it back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cuda/functions.h"

namespace gpuscope {

// Where the host side of a copy lives.
enum class HostMem : uint8_t { NotApplicable = 0, Pageable = 1, Pinned = 2, Unknown = 3 };
std::string_view to_string(HostMem);

// NCCL calls: the communicator; a collective's or send's elements, their type (ncclDataType_t)
// and reduction (ncclRedOp_t), its root or peer; a communicator's making: its rank and ranks
// (-1: not passed), and the identity all its ranks share (a hash of the ncclUniqueId they were
// given; 0: none), or the communicator it was split from, with the split's colour and key. (The
// call's CallEvent has the elements' size in `bytes`, the receive and send buffers in `ptr`, `src`.)
// Outside CallEvent: clang takes a nested struct with member initialisers as not constructible
// while the enclosing one is incomplete (std::optional<Nested>::emplace fails).
struct NcclArgs {
  uint64_t comm = 0;
  uint64_t count = 0;
  int32_t datatype = -1;
  int32_t op = -1;
  int32_t peer = -1;
  int32_t rank = -1, nranks = -1;
  uint64_t id_hash = 0;
  uint64_t parent = 0;
  int32_t color = 0, key = 0;
  // A collective or send between ncclGroupStart and ncclGroupEnd on its thread: the outermost
  // start's call_id (its kernel is launched at the group's end); 0: none.
  int64_t group = 0;
};

struct CallEvent {
  uint64_t ts_ns = 0;  // CLOCK_MONOTONIC at entry
  uint64_t duration_ns = 0;
  uint32_t pid = 0;
  uint32_t tid = 0;
  uint16_t func = 0;
  bool has_return = false;
  int64_t ret = 0;
  uint64_t py_stack = 0;  // the thread's Python stack (symbolize::PythonFrames), 0: none
  std::string comm;

  // Decoded arguments; which are meaningful depends on the function's kind.
  uint64_t stream = 0;      // stream, or the event/graph handle the call takes
  uint64_t ptr = 0;         // allocation result, freed/registered/set pointer, copy destination
  uint64_t src = 0;         // copy source
  uint64_t bytes = 0;
  cuda::CopyDir dir = cuda::CopyDir::Unknown;
  HostMem host_mem = HostMem::NotApplicable;
  // Copies: the sides that are device memory whatever the tracked allocations say (a CUDA
  // array, a symbol): kSrcOnDevice, kDstOnDevice. They resolve cudaMemcpyDefault.
  static constexpr uint8_t kSrcOnDevice = 1, kDstOnDevice = 2;
  uint8_t device_sides = 0;
  // Copies whose direction the tracker worked out from their pointers (cudaMemcpyDefault,
  // cuMemcpy): the sides it could only guess to be host memory, no tracked allocation, array or
  // symbol saying what they are (bits as in device_sides). A runtime copy around such a copy,
  // or the one copy inside it, says what they are (decode::Tracker).
  uint8_t guessed_sides = 0;
  // A copy whose extent is in a CUDA array's elements (cudaMemcpy3D, 3-D batches): per array,
  // the elements copied; the tracker adds their bytes (element size from the array's creation)
  // to `bytes`, or leaves bytes unknown.
  struct ArrayElems {
    uint64_t array = 0, elems = 0;
  };
  ArrayElems in_elements[2];
  bool bytes_known = true;   // false: the size could not be told (stored as NULL)
  uint64_t copies = 0;       // batch copies: the copies the call asked for (0: not a batch, one copy)
  uint32_t elem_size = 0;    // array creation: bytes per element from its format (0: unknown)
  uint64_t kernel_handle = 0;  // host stub (runtime) or CUfunction/CUkernel (driver)
  uint32_t grid[3] = {0, 0, 0};
  uint32_t block[3] = {0, 0, 0};
  uint32_t shared_mem = 0;
  std::string name;            // kernel name carried by lookups and registrations
  uint64_t name_addr = 0;      // where that name is in the process, when it could not be copied
  uint64_t out_handle = 0;     // handle a lookup returned
  bool out_valid = false;
  bool out_unchecked = false;  // read at the thread's next launch, not at a return that said it succeeded
  // Entered while a runtime call was pending on its thread (GS_CALL_UNDER_RUNTIME): a call the
  // runtime made, to be nested under that call, with no stack of its own.
  bool under_runtime = false;

  std::optional<NcclArgs> nccl;  // NCCL calls (cuda::Api::Nccl)

  // A runtime launch that reached the driver: the driver launch, folded into this one row
  // (one launch, one row; the driver's own row would only repeat it).
  uint16_t driver_func = 0;
  uint64_t driver_handle = 0;  // the CUfunction / CUkernel the driver launched

  // Filled by later stages.
  int64_t call_id = 0;      // row id in the record file
  int64_t parent_id = 0;    // the runtime call a driver or runtime call was made inside
  int64_t stack_id = 0;     // deduplicated stack in the record file, 0: none
  // Launches, copies and memsets under --stack-every N: how many calls this one's stack stands
  // for (N if it was taken, 0 if it was left out); 1 for every other call.
  uint32_t stack_weight = 1;
  int64_t kernel_id = 0;    // row in the kernels table, 0: unnamed
};

}  // namespace gpuscope
