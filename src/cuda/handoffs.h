// Calls that hand work to other threads. PyTorch's autograd engine runs a backward pass's
// kernels on its own device threads, which were never entered from main or from Python: their
// stacks end at the thread's start and name no line of the program. The thread that called
// loss.backward() waits meanwhile. gpuscope probes the call that hands the work over (at entry
// only: a return probe would break C++ exceptions thrown through it) and stores the worker
// threads' stacks below that call's stack (record::Stitcher).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace gpuscope::cuda {

struct HandoffSpec {
  uint16_t id;                   // the probe cookie's function id: past every CUDA function's
  std::string_view library;      // basename prefix of the file defining the functions below
  std::string_view caller;       // mangled-name prefix of the function that hands work over
  // Mangled-name prefixes of functions on the worker threads' stacks, below any work they run:
  // a stack with a frame in one of them ran on a worker.
  std::array<std::string_view, 2> workers;
  std::string_view label;        // the frame shown between a worker's stack and the caller's
  // Prefix of the name the workers give their threads: their stacks are the workers' even when
  // the walk did not reach a worker function (frame pointers stop in code built without them).
  std::string_view thread_name;
};

std::span<const HandoffSpec> all_handoffs();
const HandoffSpec* handoff_by_id(uint16_t id);
// Whether a file of this path may define handoff h's functions (by its name).
bool may_define(const HandoffSpec& h, std::string_view path);
bool may_define_handoffs(std::string_view path);

}  // namespace gpuscope::cuda
