// DWARF line tables and compile units (DebugInfo: libdw, and gpuscope's index of units by their
// ranges for files without .debug_aranges), as the report reads them for source lines: any
// file a process maps is named this way, and debug files are found beside it by build id.
#include "fuzz/fuzz_common.h"
#include "symbolize/debug_info.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpuscope::fuzz::InputFile f(data, size);
  auto info = gpuscope::symbolize::DebugInfo::open(f.path());
  if (!info) return 0;
  // Addresses over the input's first bytes, and fixed ones a small program has code at.
  for (uint64_t a : {uint64_t(0), uint64_t(0x1000), uint64_t(0x1130), uint64_t(0x401000)}) (void)info->lookup(a);
  for (size_t at = 0; at + 8 <= size && at < 64; at += 8) {
    uint64_t a;
    __builtin_memcpy(&a, data + at, 8);
    (void)info->lookup(a & 0xffffff);
  }
  return 0;
}
