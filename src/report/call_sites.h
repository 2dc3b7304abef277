// Where the report says calls came from: each stored stack's frames as the report writes them
// ("function+0xoff (module) at file:line"), the first frame outside CUDA (the call site) and the
// Python line. Frames are named by FrameNamer, the one namer, each stack once.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "report/frame_names.h"

namespace gpuscope::report {

struct StackFrame {
  std::string text;  // "function+0xoff (module)", "module+0xoffset" when unnamed, "0xip" outside any file
  std::string site;  // as a call site: text, but an unnamed frame is its module ("libtorch_cuda.so")
  std::string symbol;
  bool cuda = false;     // NamedFrame::cuda
  bool python = false;   // a Python frame: text is "qualname (file:line)"
  bool library = false;  // a Python frame in an installed package or the standard library
};

class CallSites {
 public:
  CallSites(store::Db& db, symbolize::Symbolizer& sym) : names_(db, sym) {}

  // Innermost first; empty for stack id 0 (none captured).
  const std::vector<StackFrame>& frames(int64_t stack_id);
  // The caller that matters: the first frame outside CUDA. For a launch, also past the kernel's
  // host stub, which nvcc gives the kernel's own symbol. "[no stack]" for stack id 0.
  std::string site(int64_t stack_id, const std::string& kernel_symbol = "");
  // The Python line that made the call: the innermost frame of the program's own code, then
  // the innermost Python frame when that is in a library ("train (train.py:40) → relu
  // (torch/nn/functional.py:1723)"); "" without Python frames.
  std::string python_site(int64_t stack_id);
  // python_site, else site; "" for stack id 0.
  std::string python_or_caller(int64_t stack_id);

 private:
  FrameNamer names_;
  std::unordered_map<int64_t, std::vector<StackFrame>> cache_;
};

}  // namespace gpuscope::report
