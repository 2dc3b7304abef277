#include "symbolize/debug_info.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <algorithm>
#include <cstdlib>

namespace gpuscope::symbolize {
namespace {

char* debuginfo_path = nullptr;  // libdw's default: the file's directory, .debug/, /usr/lib/debug

const Dwfl_Callbacks kOffline = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &debuginfo_path,
};

// An inlined subroutine's name is on the function it is an instance of.
const char* inlined_name(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  Dwarf_Die origin;
  if (dwarf_attr_integrate(die, DW_AT_abstract_origin, &attr) && dwarf_formref_die(&attr, &origin)) {
    Dwarf_Attribute link;
    if (const char* n = dwarf_formstring(dwarf_attr_integrate(&origin, DW_AT_linkage_name, &link))) return n;
    if (const char* n = dwarf_diename(&origin)) return n;
  }
  return dwarf_diename(die);
}

// Where an inlined instance is called from: DW_AT_call_file (an index into the CU's files)
// and DW_AT_call_line.
SourceLocation call_site(Dwarf_Die* cu, Dwarf_Die* inlined) {
  SourceLocation loc;
  Dwarf_Attribute attr;
  Dwarf_Word file_index = 0, line = 0;
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_line, &attr), &line) == 0) loc.line = static_cast<int>(line);
  Dwarf_Files* files = nullptr;
  size_t nfiles = 0;
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_file, &attr), &file_index) == 0 &&
      dwarf_getsrcfiles(cu, &files, &nfiles) == 0 && file_index < nfiles)
    if (const char* name = dwarf_filesrc(files, file_index, nullptr, nullptr)) loc.file = name;
  return loc;
}

}  // namespace

std::unique_ptr<DebugInfo> DebugInfo::open(const std::string& path) {
  std::unique_ptr<DebugInfo> d(new DebugInfo);
  d->dwfl_ = dwfl_begin(&kOffline);
  if (!d->dwfl_) return nullptr;
  dwfl_report_begin(d->dwfl_);
  // Reported at address 0: lookups are in the file's own virtual addresses.
  d->module_ = dwfl_report_elf(d->dwfl_, path.c_str(), path.c_str(), -1, 0, false);
  dwfl_report_end(d->dwfl_, nullptr, nullptr);
  if (!d->module_) return nullptr;
  Dwarf_Addr bias = 0;
  if (!dwfl_module_getdwarf(d->module_, &bias)) return nullptr;  // no DWARF here or in a debug file
  return d;
}

DebugInfo::~DebugInfo() {
  if (dwfl_) dwfl_end(dwfl_);
}

uint64_t DebugInfo::unit_by_ranges(uint64_t dwarf_addr) const {
  if (!unit_ranges_built_) {
    unit_ranges_built_ = true;
    Dwarf_Addr bias = 0;
    Dwarf* dw = dwfl_module_getdwarf(module_, &bias);
    Dwarf_Off off = 0, next = 0;
    size_t header_size = 0;
    // Bounded: a crafted file must not make this unbounded work.
    for (int units = 0; dw && units < 1'000'000 && dwarf_nextcu(dw, off, &next, &header_size, nullptr, nullptr, nullptr) == 0;
         off = next, ++units) {
      Dwarf_Die cu;
      if (!dwarf_offdie(dw, off + header_size, &cu)) continue;
      Dwarf_Addr base = 0, low = 0, high = 0;
      ptrdiff_t at = 0;
      while ((at = dwarf_ranges(&cu, at, &base, &low, &high)) > 0)
        if (low < high) unit_ranges_.push_back({low, high, dwarf_dieoffset(&cu)});
    }
    std::sort(unit_ranges_.begin(), unit_ranges_.end(), [](const UnitRange& a, const UnitRange& b) { return a.low < b.low; });
  }
  auto it = std::upper_bound(unit_ranges_.begin(), unit_ranges_.end(), dwarf_addr,
                             [](uint64_t a, const UnitRange& r) { return a < r.low; });
  // Ranges of different units do not overlap in a sound file; look back a few in case they do.
  for (int back = 0; back < 8 && it != unit_ranges_.begin(); ++back) {
    --it;
    if (dwarf_addr < it->high) return it->die_offset;
  }
  return 0;
}

std::optional<SourceInfo> DebugInfo::lookup(uint64_t vaddr) const {
  SourceInfo info;
  int lineno = 0;
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = nullptr;
  Dwarf_Die found;
  if (Dwfl_Line* line = dwfl_module_getsrc(module_, vaddr)) {
    if (const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr)) info.location = {file, lineno};
    cu = dwfl_module_addrdie(module_, vaddr, &bias);
  } else {
    // No unit found through .debug_aranges: through the units' own ranges.
    Dwarf* dw = dwfl_module_getdwarf(module_, &bias);
    const uint64_t off = dw ? unit_by_ranges(vaddr - bias) : 0;
    if (!off || !dwarf_offdie(dw, off, &found)) return std::nullopt;
    cu = &found;
    Dwarf_Line* l = dwarf_getsrc_die(cu, vaddr - bias);
    if (!l) return std::nullopt;
    if (const char* file = dwarf_linesrc(l, nullptr, nullptr)) {
      dwarf_lineno(l, &lineno);
      info.location = {file, lineno};
    }
  }
  Dwarf_Die* scopes = nullptr;
  const int n = cu ? dwarf_getscopes(cu, vaddr - bias, &scopes) : 0;
  // scopes[] is innermost first: the inlined instances, then the function they were inlined into.
  info.in_function = info.location;
  bool outermost = true;
  for (int i = n - 1; i >= 0; --i) {
    if (dwarf_tag(&scopes[i]) != DW_TAG_inlined_subroutine) continue;
    if (outermost) info.in_function = call_site(cu, &scopes[i]);
    outermost = false;
    if (const char* name = inlined_name(&scopes[i])) info.inlined.emplace_back(name);
  }
  free(scopes);
  return info;
}

}  // namespace gpuscope::symbolize
