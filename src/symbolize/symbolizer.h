// Names frames stored as (file, build id, file offset) when a report is made, keeping a
// bounded cache of indexed files. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <memory>
#include <string>
#include <unordered_map>

#include "symbolize/debug_info.h"
#include "elf/elf_file.h"

namespace gpuscope::symbolize {

struct Frame {
  std::string module;
  uint64_t file_offset = 0;
  std::string function;  // demangled; "" when unknown
  uint64_t offset_in_function = 0;
  std::string raw_function;  // as the symbol table has it
  // With want_source, from DWARF where the file (or its debug file) has it: the source line, and
  // the functions inlined there (demangled, outermost first).
  std::optional<SourceInfo> source;
};

class Symbolizer {
 public:
  explicit Symbolizer(size_t max_open_files = 64) : max_files_(max_open_files == 0 ? 1 : max_open_files) {}
  // Never throws: a missing or unreadable file, or one whose build id differs from a non-empty
  // expected one (it changed since the recording), gives an empty function.
  // return_address: the frame is a caller's, whose call instruction ends just before the offset
  // (source lines are looked up there).
  Frame resolve(const std::string& path, const std::string& expected_build_id, uint64_t file_offset,
                bool want_source = false, bool return_address = false);

 private:
  struct Entry {
    std::unique_ptr<elf::ElfFile> elf;  // null: could not be opened
    std::unique_ptr<DebugInfo> debug;
    bool debug_tried = false;
    std::list<std::string>::iterator lru;
  };
  Entry* entry(const std::string& path);

  size_t max_files_;
  std::unordered_map<std::string, Entry> files_;
  std::list<std::string> lru_;  // paths, most recently used first
};

}  // namespace gpuscope::symbolize
