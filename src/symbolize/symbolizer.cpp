#include "symbolize/symbolizer.h"

namespace gpuscope::symbolize {

const ElfFile* Symbolizer::file(const std::string& path) {
  if (auto it = files_.find(path); it != files_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return it->second.elf.get();
  }
  std::unique_ptr<ElfFile> elf;
  try {
    elf = ElfFile::open(path);
  } catch (const std::exception&) {
    // Remembered as unreadable: a report asks about the same files many times.
  }
  if (files_.size() >= max_files_) {
    files_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(path);
  return files_.emplace(path, Entry{std::move(elf), lru_.begin()}).first->second.elf.get();
}

Frame Symbolizer::resolve(const std::string& path, const std::string& expected_build_id, uint64_t file_offset) {
  Frame f;
  f.module = path;
  f.file_offset = file_offset;
  const ElfFile* elf = file(path);
  if (!elf || (!expected_build_id.empty() && elf->build_id() != expected_build_id)) return f;
  if (auto s = elf->symbolize(file_offset)) {
    f.function = demangle(s->first.name);
    f.offset_in_function = s->second;
    f.raw_function = std::move(s->first.name);
  }
  return f;
}

}  // namespace gpuscope::symbolize
