#include "symbolize/symbolizer.h"

namespace gpuscope::symbolize {

const ElfFile* Symbolizer::file(const std::string& path, const std::string& expected_build_id) {
  const std::string key = path + '\0' + expected_build_id;
  if (auto it = files_.find(key); it != files_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return it->second.elf.get();
  }
  std::unique_ptr<ElfFile> elf;
  try {
    elf = ElfFile::open(path);
    if (!expected_build_id.empty() && elf->build_id() != expected_build_id) elf.reset();
  } catch (const std::exception&) {
  }
  if (files_.size() >= max_files_) {
    files_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(key);
  return files_.emplace(key, Entry{std::move(elf), lru_.begin()}).first->second.elf.get();
}

Frame Symbolizer::resolve(const std::string& path, const std::string& expected_build_id, uint64_t file_offset) {
  Frame f;
  f.module = path;
  f.file_offset = file_offset;
  if (const ElfFile* elf = file(path, expected_build_id)) {
    if (auto s = elf->symbolize(file_offset)) {
      f.raw_function = s->first.name;
      f.function = demangle(s->first.name);
      f.offset_in_function = s->second;
    }
  }
  return f;
}

}  // namespace gpuscope::symbolize
