// ELF files and their .eh_frame / .eh_frame_hdr / CFI, as compile_unwind_table reads them: a
// process on the node can map any file it likes, and gpuscope (root) parses it.
#include "fuzz/fuzz_common.h"
#include "common/error.h"
#include "symbolize/unwind_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpuscope::fuzz::InputFile f(data, size);
  try {
    auto t = gpuscope::symbolize::compile_unwind_table(f.path());
    gpuscope::symbolize::build_index(t);
    for (uint64_t pc : {uint64_t(0), uint64_t(0x1000), uint64_t(0x401000)}) (void)t.find(pc);
  } catch (const gpuscope::Error&) {
  }
  return 0;
}
