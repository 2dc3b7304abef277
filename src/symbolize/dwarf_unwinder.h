// Unwinds a user stack from a copy of its top and the thread's registers, with the call frame
// information (.eh_frame, .debug_frame) of the binaries mapped in the process: stacks through
// code built without frame pointers. Per-process state (libdw's Dwfl) is kept until forget().
// Not thread-safe: one pipeline thread uses it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "events.h"

struct Dwfl;

namespace gpuscope::symbolize {

class DwarfUnwinder {
 public:
  DwarfUnwinder();
  ~DwarfUnwinder();
  DwarfUnwinder(const DwarfUnwinder&) = delete;
  DwarfUnwinder& operator=(const DwarfUnwinder&) = delete;

  // Addresses innermost first: regs.ip, then return addresses. Stops where the copy ends, at
  // code without unwind information, or after max_depth frames. Empty when the process's
  // modules cannot be read.
  std::vector<uint64_t> unwind(pid_t pid, pid_t tid, const gs_user_regs& regs, std::span<const uint8_t> stack,
                               size_t max_depth);
  void forget(pid_t pid);

  struct Current {  // what the callbacks read during one unwind
    pid_t tid = 0;
    const gs_user_regs* regs = nullptr;
    std::span<const uint8_t> stack;
  };

 private:
  struct Process;
  Process* process(pid_t pid);
  std::unordered_map<pid_t, std::unique_ptr<Process>> procs_;
  Current current_;
};

}  // namespace gpuscope::symbolize
