#include "symbolize/dwarf_unwinder.h"

#include "common/clock.h"

#include <elfutils/libdwfl.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

namespace gpuscope::symbolize {
namespace {

using Current = DwarfUnwinder::Current;

// One thread per unwind: the one whose registers and stack copy are current.
pid_t next_thread(Dwfl*, void* arg, void** thread_arg) {
  if (*thread_arg) return 0;
  *thread_arg = arg;
  return static_cast<Current*>(arg)->tid;
}

bool get_thread(Dwfl*, pid_t tid, void* arg, void** thread_arg) {
  *thread_arg = arg;
  return static_cast<Current*>(arg)->tid == tid;
}

// Only the copied stack is read: the live process has moved on since the sample.
bool memory_read(Dwfl*, Dwarf_Addr addr, Dwarf_Word* result, void* arg) {
  auto* cur = static_cast<Current*>(arg);
  const uint64_t sp = cur->regs->sp;
  // (Checked without overflow: addr comes from the target's stack.)
  if (addr < sp || cur->stack.size() < sizeof(Dwarf_Word) || addr - sp > cur->stack.size() - sizeof(Dwarf_Word)) {
    cur->read_outside_copy = true;
    return false;
  }
  std::memcpy(result, cur->stack.data() + (addr - sp), sizeof(Dwarf_Word));
  return true;
}

bool set_initial_registers(Dwfl_Thread* thread, void* arg) {
  const gs_user_regs& r = *static_cast<Current*>(arg)->regs;
  // DWARF register numbers on x86-64: rax rdx rcx rbx rsi rdi rbp rsp r8..r15 rip. The
  // caller-saved ones are not needed to unwind and are left at zero.
  Dwarf_Word regs[17] = {};
  regs[3] = r.bx;
  regs[6] = r.bp;
  regs[7] = r.sp;
  regs[12] = r.r12;
  regs[13] = r.r13;
  regs[14] = r.r14;
  regs[15] = r.r15;
  regs[16] = r.ip;
  if (!dwfl_thread_state_registers(thread, 0, 17, regs)) return false;
  dwfl_thread_state_register_pc(thread, r.ip);
  return true;
}

const Dwfl_Thread_Callbacks kThreadCallbacks = {next_thread, get_thread, memory_read, set_initial_registers,
                                                 nullptr, nullptr};

const Dwfl_Callbacks kCallbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = nullptr,
    .debuginfo_path = nullptr,
};

struct Walk {
  std::vector<uint64_t>* out;
  size_t max_depth;
};

int on_frame(Dwfl_Frame* frame, void* arg) {
  auto* walk = static_cast<Walk*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dwfl_frame_pc(frame, &pc, &activation) || pc == 0) return DWARF_CB_ABORT;
  walk->out->push_back(pc);
  return walk->out->size() >= walk->max_depth ? DWARF_CB_ABORT : DWARF_CB_OK;
}

}  // namespace

struct DwarfUnwinder::Process {
  Dwfl* dwfl = nullptr;
  uint64_t reported_ns = 0;
  ~Process() {
    if (dwfl) dwfl_end(dwfl);
  }
};

DwarfUnwinder::DwarfUnwinder(ProcessMaps& maps) : maps_(maps) {}

// (Re)reports the process's modules to libdw, from gpuscope's snapshot of its mappings written
// out in /proc/PID/maps form: at first use, and when a pc falls outside every module. libdw
// opens a module's file at the first walk that needs it, which may come after the process has
// exited: a path through its root (/proc/PID/root/...) would fail then, and the module stay
// without call frame information for good (walks through it went astray on frame pointers).
bool DwarfUnwinder::report(Process& p, pid_t pid) {
  std::string text, path;
  const discover::Mapping* last = nullptr;
  for (const auto& m : maps_.mappings(pid)) {
    if (!last || last->path != m.path || last->inode != m.inode) path = lasting_path(pid, m);
    last = &m;
    text += fmt::format("{:x}-{:x} {}p {:08x} {:02x}:{:02x} {} {}\n", m.start, m.end, m.executable ? "r-x" : "r--",
                        m.offset, m.dev_major, m.dev_minor, m.inode, path);
  }
  if (text.empty()) return false;
  FILE* f = fmemopen(text.data(), text.size(), "r");
  if (!f) return false;
  dwfl_report_begin(p.dwfl);
  const int rc = dwfl_linux_proc_maps_report(p.dwfl, f);
  dwfl_report_end(p.dwfl, nullptr, nullptr);
  fclose(f);
  p.reported_ns = monotonic_ns();
  return rc == 0;
}

// Samples often stop in code of no file (the vDSO's clock_gettime, which CUDA's waits call, or
// JIT code): re-reading the maps and re-reporting every module for each of them cost more than
// the rest of the unwind. Only a pc in a file mapped since is worth it.
bool DwarfUnwinder::report_for(Process& p, pid_t pid, uint64_t pc) {
  constexpr uint64_t kMinReportIntervalNs = 20'000'000;  // as ProcessMaps re-reads at most
  if (monotonic_ns() - p.reported_ns < kMinReportIntervalNs || !maps_.resolve(pid, pc)) return false;
  return report(p, pid);
}
DwarfUnwinder::~DwarfUnwinder() = default;

DwarfUnwinder::Process* DwarfUnwinder::process(pid_t pid) {
  auto& p = procs_[pid];
  if (p) return p->dwfl ? p.get() : nullptr;
  p = std::make_unique<Process>();
  p->dwfl = dwfl_begin(&kCallbacks);
  if (!p->dwfl || !report(*p, pid) || !dwfl_attach_state(p->dwfl, nullptr, pid, &kThreadCallbacks, &current_)) {
    if (p->dwfl) dwfl_end(p->dwfl);
    p->dwfl = nullptr;
    return nullptr;
  }
  return p.get();
}

DwarfUnwinder::Result DwarfUnwinder::unwind(pid_t pid, pid_t tid, const gs_user_regs& regs,
                                            std::span<const uint8_t> stack, size_t max_depth) {
  Result out;
  Process* p = process(pid);
  if (!p) return out;
  if (!dwfl_addrmodule(p->dwfl, regs.ip)) report_for(*p, pid, regs.ip);
  for (int attempt = 0;; ++attempt) {
    current_ = {tid, &regs, stack};
    out.ips.clear();
    Walk walk{&out.ips, max_depth};
    // 0: no more frames, -1: an error, DWARF_CB_ABORT: depth or a bad pc. libdw also ends a
    // walk with 0 when a read fails, so reads past the copy are watched for separately.
    const int rc = dwfl_getthread_frames(p->dwfl, tid, on_frame, &walk);
    out.complete = rc == 0 && !current_.read_outside_copy && out.ips.size() < max_depth;
    // A walk that ran into code of no known module may have met a library mapped since the
    // modules were last reported (the first stacks of a process come while it is loading).
    if (out.complete || attempt > 0 || out.ips.empty() || dwfl_addrmodule(p->dwfl, out.ips.back())) break;
    if (!report_for(*p, pid, out.ips.back())) break;
  }
  return out;
}

void DwarfUnwinder::forget(pid_t pid) { procs_.erase(pid); }

}  // namespace gpuscope::symbolize
