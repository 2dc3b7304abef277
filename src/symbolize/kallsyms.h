// Kernel addresses to function names, from /proc/kallsyms (root sees real addresses; others
// see zeros, and then nothing resolves).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpuscope::symbolize {

class Kallsyms {
 public:
  // Reads the file now; an unreadable one leaves the table empty.
  explicit Kallsyms(const std::string& path = "/proc/kallsyms");
  // "function" (with " [module]" for a loadable module's), or "" when the address is unknown.
  std::string resolve(uint64_t addr) const;
  size_t size() const { return syms_.size(); }

 private:
  struct Sym {
    uint64_t addr;
    std::string name;
  };
  std::vector<Sym> syms_;  // sorted by address
};

}  // namespace gpuscope::symbolize
