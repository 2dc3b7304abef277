// Which frames of a stack a flame graph (or a short stack in the timeline) shows, as py-spy and
// Pyroscope show Python programs:
//   auto (the default): in a stack with Python frames, the Python frames, and below the innermost
//        of them the native frames that are not the interpreter's own (the extension's code, the
//        CUDA library); the interpreter's frames between and above Python frames are left out.
//   none: the Python frames and the innermost frame alone (the CUDA function called, the function
//        on the CPU).
//   all:  every frame.
// In every view a stack without Python frames keeps all its frames (native programs, threads that
// run no Python), as do markers ("[truncated stack]", handoffs) and OS kernel frames, and a run of
// unsymbolised frames of one library is one frame named by the library ("libtorch_cuda.so").
#pragma once

#include <string>
#include <vector>

#include "report/frame_names.h"

namespace gpuscope::report {

enum class NativeView { Auto, None, All };

NativeView parse_native_view(const std::string& s);  // throws Error naming the views
const char* to_string(NativeView v);

struct ShownFrame {
  std::string label;         // frame_label(*frame), or one of the functions inlined in it
  const NamedFrame* frame;   // for a run of unsymbolised frames of one library, its first
};

// The frames a view shows, in the order given. `root_first`: the frames of one stack, outermost
// first (OS kernel frames, when there are any, after the user stack's). A native frame with
// functions inlined in it gives its function, then each inlined one.
std::vector<ShownFrame> view_stack(const std::vector<const NamedFrame*>& root_first, NativeView view,
                                   bool kernel_suffix = true);

}  // namespace gpuscope::report
