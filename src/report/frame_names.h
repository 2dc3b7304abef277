// The one namer of stored frames: each frame of a stored stack with what it is (Python, native,
// OS kernel, a marker the recorder wrote) and its names, for the flame graphs, the report and the
// timeline, which each write it in their own way (frame_label() for the short name all share).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "report/stored_stacks.h"
#include "symbolize/symbolizer.h"

namespace gpuscope::report {

struct NamedFrame {
  enum class Kind : uint8_t {
    Native,   // in a file: function from its symbols, or none (unsymbolised)
    Python,   // a Python frame: function is "qualname (file:line)"
    Kernel,   // the OS kernel's (CPU samples): function from kallsyms, or none
    Marker,   // named by the recorder: "[truncated stack]", "[torch autograd engine thread]"
    Unknown,  // an address in no file (JIT code, or a frame pointer that led astray)
  };
  Kind kind = Kind::Unknown;
  const StoredFrameRow* row = nullptr;  // path, build id, offset, address
  std::string function;                 // demangled; "" when unsymbolised
  // Native frames: the symbol as the file has it, the offset in it, and with source lines the
  // functions inlined at this address (outermost first) and the line in the frame's own function.
  std::string raw_symbol;
  uint64_t offset_in_function = 0;
  std::vector<std::string> inlined;
  std::string source_file;
  int source_line = 0;
  // A native frame in the CPython interpreter (python3.X or libpython3.X): its call machinery,
  // which the default flame graph view leaves out.
  bool interpreter = false;
  // Says how CUDA works, not who called it: a frame in CUDA's libraries, in the runtime linked
  // statically or its inline C++ wrappers (named like the API), or in nvcc's launch glue.
  bool cuda = false;
  // A Python frame in an installed package or the standard library, not the program's own code.
  bool python_library = false;

  bool symbolised() const { return !function.empty(); }
  // The file's base name ("libtorch_cuda.so"); "" for frames in no file.
  std::string module() const;
};

// A stored frame's kind and the names the record already holds (Python frames, kernel functions,
// the recorder's markers). A native frame's function is left empty, for a symbolizer to fill:
// FrameNamer's, or the agent's passes over each file's symbols.
NamedFrame classify_frame(const StoredFrameRow& row);

// A frame's name in a flame graph or a short stack: the function; for an unsymbolised native
// frame its library's name (a run of them is one box: stack_view groups them); "[unknown]" for an
// address in no file; kernel frames end in "_[k]" with kernel_suffix. With `addresses` (the
// agent's live profiles, merged by name across windows), an unsymbolised frame keeps its place:
// "libfoo.so+0x1a2b" (native_label), and one in no file its address.
std::string frame_label(const NamedFrame& f, bool kernel_suffix = true, bool addresses = false);
// A native frame as the agent names it: its function, or without one its file and offset.
std::string native_label(const std::string& function, const std::string& path, uint64_t offset);

class FrameNamer {
 public:
  // with_source: source lines and inlined functions from DWARF (slower; the timeline needs none).
  FrameNamer(store::Db& db, symbolize::Symbolizer& sym, bool with_source = true)
      : sym_(sym), stored_(db), with_source_(with_source) {}
  // Innermost first; empty for stack id 0 (none captured). Each stack is named once.
  const std::vector<NamedFrame>& operator()(int64_t stack_id);

 private:
  symbolize::Symbolizer& sym_;
  StoredStacks stored_;
  bool with_source_;
  std::unordered_map<int64_t, std::vector<NamedFrame>> cache_;
  std::unordered_map<std::string, bool> interpreter_;  // by path: is it CPython's executable or library?
};

}  // namespace gpuscope::report
