// Python interpreters as gpuscope finds them in a process's mappings: any file named like
// python3.X or libpython3.X is read (its symbols, Py_Version, and 3.13's _Py_DebugOffsets in
// _PyRuntime) to decide how to walk the process's Python stacks.
#include "fuzz/fuzz_common.h"
#include "discover/python.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpuscope::fuzz::InputFile f(data, size);
  // The name stands in where the file has no Py_Version (before 3.11).
  (void)gpuscope::discover::inspect_python_binary(f.path(), "/usr/lib/libpython3.13.so.1.0");
  (void)gpuscope::discover::inspect_python_binary(f.path(), "/usr/bin/python3.10");
  return 0;
}
