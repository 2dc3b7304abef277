// Stack copies unwound in user space (--call-stacks dwarf, and eh-frame's copies while a table is
// compiled): the registers and the 16 KiB of stack come from the target, so the walk's every
// step reads data the target chose. Unwound here against this process's own mappings and
// call frame information (libdw), as the pipeline does for a target's.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "events.h"
#include "symbolize/dwarf_unwinder.h"
#include "symbolize/process_maps.h"

namespace {

struct Text {
  uint64_t start, len;
};

// This process's executable mappings: a stack word marked 0xAA in its top byte stands for an
// address in one of them, so that walks go deep without the fuzzer guessing addresses.
std::vector<Text> text_mappings() {
  std::vector<Text> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    if (perms.size() < 3 || perms[2] != 'x') continue;
    const uint64_t start = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
    const uint64_t end = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
    out.push_back({start, end - start});
  }
  return out;
}

uint64_t into_text(const std::vector<Text>& text, uint64_t word) {
  const auto& t = text[(word >> 32) % text.size()];
  return t.start + (word & 0xffffffff) % t.len;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpuscope;
  static const auto text = text_mappings();
  static symbolize::ProcessMaps maps;
  static symbolize::DwarfUnwinder unwinder(maps);
  if (text.empty() || size < sizeof(gs_user_regs)) return 0;
  gs_user_regs regs;
  std::memcpy(&regs, data, sizeof(regs));
  std::vector<uint8_t> stack(data + sizeof(regs), data + std::min<size_t>(size, sizeof(regs) + GS_STACK_COPY));
  stack.resize(stack.size() & ~size_t(7));
  for (size_t at = 0; at < stack.size(); at += 8) {
    uint64_t word;
    std::memcpy(&word, stack.data() + at, 8);
    if ((word >> 56) == 0xAA) {
      word = into_text(text, word & 0x00ffffffffffffffull);
      std::memcpy(stack.data() + at, &word, 8);
    }
  }
  if ((regs.ip >> 56) == 0xAA) regs.ip = into_text(text, regs.ip & 0x00ffffffffffffffull);
  (void)unwinder.unwind(getpid(), gettid(), regs, stack, GS_MAX_UNWIND_DEPTH);
  return 0;
}
