#include "report/stack_view.h"

#include "common/error.h"

namespace gpuscope::report {
namespace {

using Kind = NamedFrame::Kind;

// Frames that read as one box: unsymbolised frames of one file, or addresses in no file.
bool same_group(const NamedFrame& a, const NamedFrame& b) {
  if (a.kind == Kind::Unknown || b.kind == Kind::Unknown) return a.kind == b.kind;
  return a.kind == Kind::Native && b.kind == Kind::Native && !a.symbolised() && !b.symbolised() &&
         a.row->path == b.row->path;
}

}  // namespace

NativeView parse_native_view(const std::string& s) {
  if (s == "auto") return NativeView::Auto;
  if (s == "none") return NativeView::None;
  if (s == "all") return NativeView::All;
  throw Error("unknown --native view '{}': use auto (Python frames and the native code below them), none "
              "(Python frames only) or all",
              s);
}

const char* to_string(NativeView v) {
  switch (v) {
    case NativeView::Auto: return "auto";
    case NativeView::None: return "none";
    case NativeView::All: break;
  }
  return "all";
}

std::vector<ShownFrame> view_stack(const std::vector<const NamedFrame*>& root_first, NativeView view,
                                   bool kernel_suffix) {
  // The outermost and innermost Python frames, and the innermost frame of the user stack.
  size_t first_py = root_first.size(), last_py = 0, leaf = root_first.size();
  for (size_t i = 0; i < root_first.size(); ++i) {
    if (root_first[i]->kind == Kind::Python) {
      first_py = std::min(first_py, i);
      last_py = i;
    }
    if (root_first[i]->kind != Kind::Kernel) leaf = i;
  }
  const bool python = first_py < root_first.size();

  auto shown = [&](size_t i) {
    const NamedFrame& f = *root_first[i];
    if (!python || view == NativeView::All || i == leaf) return true;
    switch (f.kind) {
      case Kind::Python:
      case Kind::Marker:
      case Kind::Kernel:
        return true;
      case Kind::Native:
      case Kind::Unknown:
        // Below the innermost Python frame: what the extension did, less the interpreter's own
        // frames (its C-call machinery, or the C API the extension called into).
        return view == NativeView::Auto && i > last_py && !f.interpreter;
    }
    return false;
  };

  std::vector<ShownFrame> out;
  const NamedFrame* last = nullptr;
  for (size_t i = 0; i < root_first.size(); ++i) {
    if (!shown(i)) continue;
    const NamedFrame& f = *root_first[i];
    if (last && same_group(*last, f)) continue;  // the run is one frame, named by its library
    last = &f;
    out.push_back({frame_label(f, kernel_suffix), &f});
    // Functions inlined at this address are frames of their own, as the source reads.
    for (const auto& name : f.inlined) out.push_back({name, &f});
  }
  return out;
}

}  // namespace gpuscope::report
