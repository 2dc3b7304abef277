// Source lines and inlined functions from a binary's DWARF (its own .debug_info, or a separate
// debug file found by build id or .gnu_debuglink under /usr/lib/debug), through libdw.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct Dwfl;
struct Dwfl_Module;

namespace gpuscope::symbolize {

struct SourceLocation {
  std::string file;
  int line = 0;
};

struct SourceInfo {
  SourceLocation location;  // of the instruction itself (innermost inlined function's code)
  // Functions inlined at the instruction, outermost first: the symbol's function called the
  // first, which called the next...
  std::vector<std::string> inlined;
  // The line in the symbol's own function: where the outermost inlined call is written, or the
  // instruction's line when nothing is inlined there.
  SourceLocation in_function;
};

class DebugInfo {
 public:
  // Null when the file has no line information anywhere it could be found.
  static std::unique_ptr<DebugInfo> open(const std::string& path);
  ~DebugInfo();
  DebugInfo(const DebugInfo&) = delete;
  DebugInfo& operator=(const DebugInfo&) = delete;

  // vaddr is the ELF's own virtual address (st_value space).
  std::optional<SourceInfo> lookup(uint64_t vaddr) const;

 private:
  DebugInfo() = default;
  // The compile unit covering vaddr (in the DWARF's addresses), found from each unit's own
  // ranges: clang writes no .debug_aranges, which libdw 0.188 needs to find a unit by address.
  // Its DIE offset, or 0.
  uint64_t unit_by_ranges(uint64_t dwarf_addr) const;
  struct UnitRange {
    uint64_t low, high, die_offset;
  };
  Dwfl* dwfl_ = nullptr;
  Dwfl_Module* module_ = nullptr;
  mutable std::vector<UnitRange> unit_ranges_;  // sorted by low; built at the first miss
  mutable bool unit_ranges_built_ = false;
};

}  // namespace gpuscope::symbolize
