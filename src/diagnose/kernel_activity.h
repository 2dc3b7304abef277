// What a thread was doing in the kernel when a CPU sample found it there, from the sample's
// kernel stack: the system call it made, a page fault it took, or an interrupt it was serving.
// The evidence of host_kernel: "in the kernel 30% of the step, mostly in page faults".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gpuscope::diagnose {

// `frames`: the kernel stack's function names, innermost first. The outermost frame that names
// an entry wins (a system call interrupted by a device is the system call's time): a system
// call's name ("futex", "read"), "page faults", "interrupts"; "" if none is named.
std::string kernel_activity(const std::vector<std::string>& frames);

}  // namespace gpuscope::diagnose
