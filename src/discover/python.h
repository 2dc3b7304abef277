// CPython interpreters in target processes: which file holds the interpreter, its version, and
// how that version lays out the structures gpuscope walks (thread states, frames, code
// objects). The offsets are data per version (python.cpp), found in live interpreters with
// tools/python_offsets.py; the version is read from the binary, never guessed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "discover/proc.h"
#include "events.h"

namespace gpuscope::discover {

struct PythonLayout {
  int major = 0, minor = 0;
  gs_py_offsets bpf{};             // what the BPF side walks
  uint16_t code_adaptive = 0;      // offsetof(PyCodeObject, co_code_adaptive): instructions start here
  uint16_t unicode_compact_data = 0;  // characters of a compact non-ASCII str
  // 3.13+: a frame's instruction pointer is the next instruction, not the one being run.
  bool instr_is_next = false;
  // 3.10: a frame's "instruction" is f_lasti (the index of the instruction being run, in code
  // units, an int), and co_linetable holds (bytecode delta, line delta) pairs.
  bool lasti_index = false;
};

// The layout of a CPython version in gpuscope's table (3.10, 3.11, 3.12), or null. 3.13's is read
// from the interpreter itself (inspect_python_binary).
const PythonLayout* python_layout(int major, int minor);
// Versions gpuscope walks, for messages: "3.10, 3.11, 3.12, 3.13".
std::string supported_python_versions();

// A file (executable or libpython) that defines the interpreter.
struct PythonBinary {
  std::string path;  // as the process sees it
  int major = 0, minor = 0, micro = 0;  // micro -1: unknown (before 3.11, from the file's name)
  std::shared_ptr<const PythonLayout> layout;  // null: a version gpuscope cannot walk
  uint64_t runtime_offset = 0;           // _PyRuntime's file offset (it is initialised data)
  // _PyEval_EvalFrameDefault as file offsets: the native frames that run Python frames.
  uint64_t eval_begin = 0, eval_end = 0;
};

// Reads an ELF file; nullopt when it defines no interpreter (_PyRuntime). `open_path` is where
// gpuscope opens it, `path` where the process sees it. Throws nothing.
std::optional<PythonBinary> inspect_python_binary(const std::string& open_path, const std::string& path);

// The interpreter mapped by a process, from its mappings: the binary, and where its _PyRuntime
// is in the process's memory.
struct PythonProcess {
  PythonBinary binary;
  uint64_t runtime_addr = 0;
};

// The process's mappings are searched for a file named like an interpreter (python3.X,
// libpython3.X...), checked through `inspect` (which callers cache). nullopt if none.
std::optional<PythonProcess> find_python(const std::vector<Mapping>& maps,
                                         const std::function<std::optional<PythonBinary>(const Mapping&)>& inspect);

// Does the file name look like a CPython executable or library?
bool looks_like_python(const std::string& path);

}  // namespace gpuscope::discover
