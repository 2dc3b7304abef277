#include "symbolize/symbolizer.h"

namespace gpuscope::symbolize {

Symbolizer::Entry* Symbolizer::entry(const std::string& path) {
  if (auto it = files_.find(path); it != files_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return &it->second;
  }
  std::unique_ptr<elf::ElfFile> elf;
  try {
    elf = elf::ElfFile::open(path);
  } catch (const std::exception&) {
    // Remembered as unreadable: a report asks about the same files many times.
  }
  if (files_.size() >= max_files_) {
    files_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(path);
  return &files_.emplace(path, Entry{std::move(elf), nullptr, false, lru_.begin()}).first->second;
}

Frame Symbolizer::resolve(const std::string& path, const std::string& expected_build_id, uint64_t file_offset,
                          bool want_source, bool return_address) {
  Frame f;
  f.module = path;
  f.file_offset = file_offset;
  Entry* e = entry(path);
  const elf::ElfFile* elf = e->elf.get();
  if (!elf || (!expected_build_id.empty() && elf->build_id() != expected_build_id)) return f;
  if (auto s = elf->symbolize(file_offset)) {
    f.function = elf::demangle(s->first.name);
    f.offset_in_function = s->second;
    f.raw_function = std::move(s->first.name);
  }
  if (want_source) {
    if (!e->debug_tried) {
      e->debug_tried = true;
      e->debug = DebugInfo::open(path);
    }
    // A return address is just past its call; one at a function's very start is not a real
    // return address (no call ends there) and is looked up as it is.
    const bool in_call = return_address && f.offset_in_function > 0;
    if (auto vaddr = e->debug ? elf->offset_to_vaddr(in_call ? file_offset - 1 : file_offset) : std::nullopt) {
      f.source = e->debug->lookup(*vaddr);
      if (f.source)
        for (auto& name : f.source->inlined) name = elf::demangle(name);
    }
  }
  return f;
}

}  // namespace gpuscope::symbolize
