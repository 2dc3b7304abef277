#include "symbolize/kallsyms.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace gpuscope::symbolize {

Kallsyms::Kallsyms(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    // "ffffffff81000000 T _stext" or "ffffffffc0a01000 t nv_open\t[nvidia]"
    std::istringstream fields(line);
    std::string addr, type, name, module;
    if (!(fields >> addr >> type >> name)) continue;
    if (type != "t" && type != "T" && type != "w" && type != "W") continue;  // functions only
    const uint64_t a = std::stoull(addr, nullptr, 16);
    if (a == 0) continue;  // hidden by kptr_restrict
    if (fields >> module) name += " " + module;
    syms_.push_back({a, std::move(name)});
  }
  std::sort(syms_.begin(), syms_.end(), [](const Sym& a, const Sym& b) { return a.addr < b.addr; });
}

std::string Kallsyms::resolve(uint64_t addr) const {
  auto it = std::upper_bound(syms_.begin(), syms_.end(), addr, [](uint64_t a, const Sym& s) { return a < s.addr; });
  if (it == syms_.begin()) return {};
  return std::prev(it)->name;
}

}  // namespace gpuscope::symbolize
