#include "report/frame_names.h"

#include <fmt/format.h>

#include "cuda/functions.h"
#include "discover/python.h"

namespace gpuscope::report {
namespace {

bool in_cuda_library(const std::string& path) {
  const std::string b = base_name(path);
  return b.starts_with("libcudart") || b.starts_with("libcuda.") || b.starts_with("libcupti") ||
         b.starts_with("libnccl");
}

// The name a demangled declaration declares: "cudaError cudaMalloc<float>(float**, unsigned long)" → cudaMalloc.
std::string_view declared_name(std::string_view decl) {
  decl = decl.substr(0, decl.find_first_of("(<"));
  return decl.substr(decl.rfind(' ') + 1);
}

}  // namespace

std::string NamedFrame::module() const {
  return row && row->in_file && kind == Kind::Native ? base_name(row->path) : std::string();
}

std::string native_label(const std::string& function, const std::string& path, uint64_t offset) {
  return function.empty() ? fmt::format("{}+{:#x}", base_name(path), offset) : function;
}

std::string frame_label(const NamedFrame& f, bool kernel_suffix, bool addresses) {
  switch (f.kind) {
    case NamedFrame::Kind::Python:
    case NamedFrame::Kind::Marker:
      return f.function;
    case NamedFrame::Kind::Kernel:
      return (f.symbolised() ? f.function : fmt::format("{:#x}", f.row->ip)) + (kernel_suffix ? "_[k]" : "");
    case NamedFrame::Kind::Native:
      if (addresses) return native_label(f.function, f.row->path, f.row->offset);
      return f.symbolised() ? f.function : f.module();
    case NamedFrame::Kind::Unknown:
      if (addresses) return fmt::format("{:#x}", f.row->ip);
      break;
  }
  return "[unknown]";
}

NamedFrame classify_frame(const StoredFrameRow& row) {
  NamedFrame f;
  f.row = &row;
  if (!row.in_file) {
    f.kind = NamedFrame::Kind::Unknown;
  } else if (row.python) {
    f.kind = NamedFrame::Kind::Python;
    f.function = row.python->text();
    f.python_library = short_python_path(row.python->file) != row.python->file;
  } else if (row.kernel()) {
    f.kind = NamedFrame::Kind::Kernel;
    if (row.recorded_name) f.function = *row.recorded_name;
  } else if (row.recorded_name) {
    f.kind = NamedFrame::Kind::Marker;
    f.function = *row.recorded_name;
  } else if (row.path == "[python]") {
    f.kind = NamedFrame::Kind::Marker;  // its Python frame is not in the record (or no longer held)
    f.function = "[python frame]";
  } else {
    f.kind = NamedFrame::Kind::Native;
  }
  return f;
}

const std::vector<NamedFrame>& FrameNamer::operator()(int64_t stack_id) {
  auto [it, added] = cache_.try_emplace(stack_id);
  if (!added || stack_id == 0) return it->second;
  for (const auto& row : stored_(stack_id)) {
    NamedFrame f = classify_frame(row);
    if (f.kind == NamedFrame::Kind::Native) {
      // Frames above the innermost are return addresses: their line is the call's.
      auto s = sym_.resolve(row.path, row.build_id, row.offset, with_source_, row.depth > 0);
      f.function = std::move(s.function);
      f.raw_symbol = std::move(s.raw_function);
      f.offset_in_function = s.offset_in_function;
      if (s.source) {
        f.inlined = std::move(s.source->inlined);
        f.source_file = std::move(s.source->in_function.file);
        f.source_line = s.source->in_function.line;
      }
      auto [known, fresh] = interpreter_.try_emplace(row.path, false);
      if (fresh) known->second = discover::looks_like_python(row.path);
      f.interpreter = known->second;
      f.cuda = in_cuda_library(row.path) || f.function.starts_with("__device_stub_") ||
               cuda::function_by_symbol(declared_name(f.function)) != nullptr;
    }
    it->second.push_back(std::move(f));
  }
  return it->second;
}

}  // namespace gpuscope::report
