// Build ids of the files processes map, read once per process and path. Per process because
// the paths go through its /proc/PID/root; forgotten at its exit.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "elf/elf_file.h"
#include "symbolize/process_maps.h"

namespace gpuscope::record {

class BuildIds {
 public:
  const std::string& of(uint32_t pid, const symbolize::ModuleAddress& m) {
    auto& ids = ids_[pid];
    auto it = ids.find(m.open_path);
    // Asked again, not m.open_path: ProcessMaps reuses its answer for a while, so a process that
    // has just exited may still be given its root's path.
    if (it == ids.end()) it = ids.emplace(m.open_path, elf::read_build_id(symbolize::openable_path(pid, m.path))).first;
    return it->second;
  }
  void forget(uint32_t pid) { ids_.erase(pid); }

 private:
  std::unordered_map<uint32_t, std::unordered_map<std::string, std::string>> ids_;
};

}  // namespace gpuscope::record
