#include "report/call_sites.h"

#include <fmt/format.h>

namespace gpuscope::report {

const std::vector<StackFrame>& CallSites::frames(int64_t stack_id) {
  auto [it, added] = cache_.try_emplace(stack_id);
  if (!added || stack_id == 0) return it->second;
  for (const NamedFrame& n : names_(stack_id)) {
    StackFrame f;
    const StoredFrameRow& row = *n.row;
    f.site = frame_label(n, false);
    switch (n.kind) {
      case NamedFrame::Kind::Unknown:
        f.text = fmt::format("{:#x}", row.ip);
        break;
      case NamedFrame::Kind::Python:
        f.text = n.function;
        f.python = true;
        f.library = n.python_library;
        break;
      case NamedFrame::Kind::Marker:
      case NamedFrame::Kind::Kernel:
        f.text = n.symbolised() ? n.function : fmt::format("{}+{:#x}", base_name(row.path), row.offset);
        break;
      case NamedFrame::Kind::Native:
        f.symbol = n.raw_symbol;
        f.text = n.symbolised() ? fmt::format("{}+{:#x} ({})", n.function, n.offset_in_function, base_name(row.path))
                                : fmt::format("{}+{:#x}", base_name(row.path), row.offset);
        // The line in the frame's own function (where any inlined code was called from).
        if (!n.source_file.empty()) f.text += fmt::format(" at {}:{}", base_name(n.source_file), n.source_line);
        if (n.symbolised()) f.site = f.text;
        f.cuda = n.cuda;
        break;
    }
    it->second.push_back(std::move(f));
  }
  return it->second;
}

std::string CallSites::site(int64_t stack_id, const std::string& kernel_symbol) {
  const auto& fs = frames(stack_id);
  if (fs.empty()) return "[no stack]";
  for (const auto& f : fs)
    if (!f.cuda && !f.python && (kernel_symbol.empty() || f.symbol != kernel_symbol)) return f.site;
  return fs.back().site;
}

std::string CallSites::python_site(int64_t stack_id) {
  const StackFrame* innermost = nullptr;
  for (const auto& f : frames(stack_id)) {
    if (!f.python) continue;
    if (!innermost) innermost = &f;
    if (!f.library) return &f == innermost ? f.text : f.text + " → " + innermost->text;
  }
  return innermost ? innermost->text : std::string();
}

std::string CallSites::python_or_caller(int64_t stack_id) {
  if (!stack_id) return "";
  auto py = python_site(stack_id);
  return py.empty() ? site(stack_id) : py;
}

}  // namespace gpuscope::report
