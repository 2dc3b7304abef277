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

namespace gpuscope::elf {

struct ElfSymbol {
  std::string name;
  uint64_t file_offset = 0;
  uint64_t size = 0;
};

// Everything is read and indexed by open(); the descriptor and libelf handle are released before
// it returns, so a cache of these holds no descriptors.
class ElfFile {
 public:
  // Throws std::runtime_error naming the path and the reason (missing, not ELF, truncated).
  static std::unique_ptr<ElfFile> open(const std::string& path);

  ElfFile(ElfFile&&) = default;
  ElfFile& operator=(ElfFile&&) = default;
  ElfFile(const ElfFile&) = delete;
  ElfFile& operator=(const ElfFile&) = delete;

  // Hex of NT_GNU_BUILD_ID, "" if none.
  const std::string& build_id() const { return build_id_; }
  // File offsets of the named defined functions (what a uprobe needs). A name matches a .symtab
  // entry carrying a version ("cudaMalloc@@libcudart.so.13"); names not defined are absent.
  std::unordered_map<std::string, uint64_t> function_offsets(const std::vector<std::string>& names) const;
  bool has_function(const std::string& name) const;
  // The function containing a file offset (for an unsized symbol: the nearest preceding one in
  // the same segment), and the offset into it.
  std::optional<std::pair<ElfSymbol, uint64_t>> symbolize(uint64_t file_offset) const;
  // Between the ELF's own virtual addresses (st_value) and file offsets, through PT_LOAD segments.
  std::optional<uint64_t> vaddr_to_offset(uint64_t vaddr) const;
  std::optional<uint64_t> offset_to_vaddr(uint64_t file_offset) const;
  bool is_executable_pie_or_shared() const { return dynamic_; }  // ET_DYN

 private:
  ElfFile() = default;

  struct Segment {
    uint64_t vaddr, offset, filesz;
  };
  struct Indexed {
    ElfSymbol symbol;
    uint64_t end;  // file offset past the symbol; for an unsized one, the end of its segment
  };
  std::string build_id_;
  bool dynamic_ = false;
  std::vector<Segment> segments_;
  std::vector<Indexed> by_offset_;                     // sorted by file offset, one per offset
  std::unordered_map<std::string, uint64_t> by_name_;  // plain names, version suffix removed
};

// Itanium C++ demangling; the input unchanged when it is not a mangled name.
std::string demangle(const std::string& name);
// Does the file define (not import) a function of one of these names? Reads the symbol tables
// without indexing them: the cheap question asked of every shared object a target loads.
// False for anything unreadable.
bool defines_any_function(const std::string& path, const std::vector<std::string>& names);
// The defined functions whose (mangled) names start with one of `prefixes`, with their file
// offsets, sorted by start; read in one pass that touches only those names (libtorch's tables
// are tens of megabytes). Throws std::runtime_error for an unreadable file.
struct FunctionRange {
  std::string name;
  uint64_t start = 0, end = 0;  // file offsets: [start, end)
};
std::vector<FunctionRange> functions_with_prefixes(const std::string& path, const std::vector<std::string>& prefixes);
// A data object the file defines, at a virtual address of the file (ElfFile::vaddr_to_offset
// finds its bytes when it has initial contents).
struct ElfObject {
  uint64_t vaddr = 0, size = 0;
};
// The named data objects (STT_OBJECT) the file defines. Throws std::runtime_error for an
// unreadable file.
std::unordered_map<std::string, ElfObject> object_symbols(const std::string& path,
                                                         const std::vector<std::string>& names);
// The functions containing each of `file_offsets`, demangled ("" where none does), found in one
// pass over the symbol tables that keeps nothing else. For a caller that names a few addresses in
// large libraries now and then and must stay small (the agent): ElfFile indexes every symbol,
// which for libtorch is over a hundred megabytes. Checks the build id when one is expected.
// Throws std::runtime_error for an unreadable file or another build.
struct OffsetName {
  std::string name;               // demangled; "" where no function contains the offset
  uint64_t start = 0, end = 0;    // the function's file offsets: it names every offset in [start, end)
};
std::vector<OffsetName> name_offsets(const std::string& path, const std::string& expected_build_id,
                                     const std::vector<uint64_t>& file_offsets);
// The GNU build id of a file as hex, "" if it has none or cannot be read. Cheap: no symbols read.
std::string read_build_id(const std::string& path);

}  // namespace gpuscope::elf
