#include "diagnose/kernel_activity.h"

namespace gpuscope::diagnose {
namespace {

// A system call's wrappers: __x64_sys_NAME (and the ia32 and compat ones), __se_sys_NAME,
// __do_sys_NAME. The name, or "".
std::string_view syscall_name(std::string_view f) {
  for (std::string_view prefix : {"__x64_sys_", "__ia32_sys_", "__x64_compat_sys_", "__ia32_compat_sys_",
                                  "__se_sys_", "__do_sys_", "__se_compat_sys_", "__do_compat_sys_"})
    if (f.starts_with(prefix)) return f.substr(prefix.size());
  return {};
}

// Kernels before 5.8 enter a fault at do_page_fault (through page_fault), later ones at
// exc_page_fault (through asm_exc_page_fault).
bool is_fault(std::string_view f) {
  return f == "asm_exc_page_fault" || f == "exc_page_fault" || f == "do_user_addr_fault" || f == "page_fault" ||
         f == "do_page_fault" || f == "handle_mm_fault";
}

// Likewise interrupts: asm_sysvec_* and common_interrupt now, do_IRQ and smp_*_interrupt before.
bool is_interrupt(std::string_view f) {
  return f.starts_with("asm_sysvec_") || f.starts_with("asm_common_interrupt") || f.starts_with("sysvec_") ||
         f.ends_with("_interrupt") || f == "do_IRQ" || f == "handle_softirqs" || f == "__do_softirq" ||
         f == "irq_exit" || f == "irq_exit_rcu" || f == "__irq_exit_rcu";
}

}  // namespace

std::string kernel_activity(const std::vector<std::string>& frames) {
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    // Symbols may carry a suffix of the compiler's (".isra.0", ".cold").
    const std::string_view f = std::string_view(*it).substr(0, it->find('.'));
    if (const auto name = syscall_name(f); !name.empty()) return std::string(name);
    if (is_fault(f)) return "page faults";
    if (is_interrupt(f)) return "interrupts";
  }
  return "";
}

}  // namespace gpuscope::diagnose
