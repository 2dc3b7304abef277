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
#include "symbolize/process_maps.h"

struct Dwfl;

namespace gpuscope::symbolize {

class DwarfUnwinder {
 public:
  // Modules come from `maps` (the process may be gone by the time its stacks are unwound).
  explicit DwarfUnwinder(ProcessMaps& maps);
  ~DwarfUnwinder();
  DwarfUnwinder(const DwarfUnwinder&) = delete;
  DwarfUnwinder& operator=(const DwarfUnwinder&) = delete;

  struct Result {
    std::vector<uint64_t> ips;  // innermost first: regs.ip, then return addresses
    // true when the walk ended where the call frame information says the stack ends (the
    // program's or a thread's entry); false when it was cut: the copy ended, code without
    // unwind information, max_depth, or modules that could not be read.
    bool complete = false;
  };
  Result unwind(pid_t pid, pid_t tid, const gs_user_regs& regs, std::span<const uint8_t> stack, size_t max_depth);
  void forget(pid_t pid);

  struct Current {  // what the callbacks read during one unwind
    pid_t tid = 0;
    const gs_user_regs* regs = nullptr;
    std::span<const uint8_t> stack;
    bool read_outside_copy = false;  // the walk wanted stack beyond what was copied
  };

 private:
  struct Process;
  Process* process(pid_t pid);
  bool report(Process& p, pid_t pid);
  // Reports the modules again for a pc libdw has no module for, when a file maps it now and the
  // last report is not too recent; true if it did.
  bool report_for(Process& p, pid_t pid, uint64_t pc);
  ProcessMaps& maps_;
  std::unordered_map<pid_t, std::unique_ptr<Process>> procs_;
  Current current_;
};

}  // namespace gpuscope::symbolize
