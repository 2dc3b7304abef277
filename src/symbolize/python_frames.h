// Python stacks as the BPF side sends them (code object, instruction) turned into frames a
// person reads: qualified name, file, line. Code objects arrive as records of their own, sent
// once per process, so a stack is named after the process is gone; what a record could not
// carry (a non-ASCII name, a long line table) is read from the live process instead.
// One thread (the pipeline's) calls everything but add_process, which may come from another.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "discover/python.h"
#include "events.h"

namespace gpuscope::symbolize {

// The source line of the instruction at code unit `index` of a code object, from its 3.11+
// location table (co_linetable; Objects/locations.md in CPython). `firstlineno` where the
// table has no line for it (an index before the first instruction, or "no location").
int python_line(const std::string& linetable, int firstlineno, int64_t index);
// The same for 3.10's co_linetable ((bytecode delta, line delta) byte pairs; PEP 626), `index`
// being f_lasti.
int python310_line(const std::string& linetable, int firstlineno, int64_t index);

struct PythonFrame {
  std::string function;  // co_qualname
  std::string file;      // co_filename
  int line = 0;
  bool entry = false;  // the outermost frame of one C call into the interpreter
};

class PythonFrames {
 public:
  // Thread-safe: the recorder reports processes as it finds their interpreter.
  void add_process(pid_t pid, const discover::PythonProcess& p);
  void forget(pid_t pid);
  // A forked child runs its parent's interpreter at the same addresses.
  void on_fork(pid_t parent, pid_t child);

  void on_code(const gs_py_code_record& rec);
  // `size`: the record's bytes (it is cut after its last frame).
  void on_stack(const uint8_t* data, size_t size);
  // Stacks arrived since the last new_generation().
  size_t stacks_held() const { return current_.size(); }
  // Starts a new table of stacks; the one before stays readable until the next call. The BPF
  // side sends each stack once, so the caller first makes it forget what it sent: stacks that
  // come again are sent again, and records already under way still find theirs.
  void new_generation();

  // A stack as it was sent: (code object, instruction) per frame, innermost first.
  struct SentStack {
    pid_t pid = 0;
    bool truncated = false;
    std::vector<gs_py_frame> frames;
  };
  // Null if the stack never arrived (a lost record) or is two generations old.
  const SentStack* sent(uint64_t id) const;
  // The interpreter layout of a process found running Python; null if none or not walkable.
  std::shared_ptr<const discover::PythonLayout> layout_of(pid_t pid);
  // One sent frame of process `pid` named (layout: layout_of(pid)). Names are not kept here:
  // a caller that names often keeps what it made of them.
  PythonFrame name(pid_t pid, const discover::PythonLayout* layout, const gs_py_frame& f);
  // Is the code at this file offset of `path` the interpreter's eval loop, in that process?
  bool is_eval_loop(pid_t pid, const std::string& path, uint64_t file_offset);
  uint64_t unnamed_frames() const { return unnamed_; }
  // Moves whenever a process is added, forked or forgotten: is_eval_loop's answers may differ.
  uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }

 private:
  struct Code {
    std::string qualname, filename, linetable;
    int firstlineno = 0;
    uint16_t tag = 0;  // which of the code objects its address held in turn (GS_PY_CODE_TAG_SHIFT)
  };
  std::optional<discover::PythonProcess> process(pid_t pid);
  // Fills what the record could not carry from the live process; false if it is gone, or if
  // `tag` is not 0 and the address holds an object of another tag.
  bool read_from_process(pid_t pid, uint64_t addr, const discover::PythonLayout& layout, Code& code,
                         uint16_t have_flags, uint16_t tag);

  std::mutex mu_;
  std::unordered_map<pid_t, discover::PythonProcess> processes_;
  // By address: the latest code object there, which a new one at that address replaces.
  std::map<std::pair<pid_t, uint64_t>, Code> codes_;
  // Two generations (see new_generation). A stack sampled on the CPU is new whenever the
  // leaf's instruction is, so without a bound the tables grow for the process's life.
  std::unordered_map<uint64_t, SentStack> current_, previous_;
  uint64_t unnamed_ = 0;
  std::atomic<uint64_t> generation_{0};
};

}  // namespace gpuscope::symbolize
