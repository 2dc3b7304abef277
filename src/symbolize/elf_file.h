// An indexed ELF file: build id, function symbols by name (for attaching) and by file offset
// (for naming addresses). Both .symtab and .dynsym are read, so stripped libraries still name
// their exported functions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpuscope::symbolize {

struct ElfSymbol {
  std::string name;
  uint64_t file_offset = 0;
  uint64_t size = 0;
};

class ElfFile {
 public:
  // Throws std::runtime_error naming the path and the reason (missing, not ELF, truncated).
  static std::unique_ptr<ElfFile> open(const std::string& path);

  const std::string& build_id() const { return build_id_; }
  // File offsets of the named function symbols (what a uprobe needs); absent when not defined.
  std::unordered_map<std::string, uint64_t> function_offsets(const std::vector<std::string>& names) const;
  bool has_function(const std::string& name) const;
  // The function containing a file offset, and the offset into it.
  std::optional<std::pair<ElfSymbol, uint64_t>> symbolize(uint64_t file_offset) const;
  std::optional<uint64_t> vaddr_to_offset(uint64_t vaddr) const;

 private:
  struct Segment {
    uint64_t vaddr, offset, filesz;
  };
  std::string build_id_;
  std::vector<Segment> segments_;
  std::vector<ElfSymbol> by_offset_;                    // sorted by file_offset
  std::unordered_map<std::string, uint64_t> by_name_;  // plain names, version suffix removed
};

// Itanium C++ demangling; the input unchanged when it is not a mangled name.
std::string demangle(const std::string& name);
// Does the file define (not import) a function of one of these names? Reads the symbol tables
// without indexing them: the cheap question asked of every shared object a target loads.
bool defines_any_function(const std::string& path, const std::vector<std::string>& names);
// The GNU build id of a file as hex, "" if it has none or cannot be read. Cheap: no symbols read.
std::string read_build_id(const std::string& path);

}  // namespace gpuscope::symbolize
