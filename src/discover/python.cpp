#include "discover/python.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <memory>
#include <regex>

#include "elf/elf_file.h"

namespace gpuscope::discover {
namespace {

constexpr uint16_t kNone = GS_PY_NONE;

// Found with tools/python_offsets.py in live interpreters: 3.11.2 (Debian 12) and 3.11.7, equal
// to offsetof() against 3.11's internal headers; 3.12.3 (the GPU machine). Layouts hold within a
// minor version.
constexpr std::array kLayouts = {
    // 3.10: offsetof() against 3.10.13's headers (Include/cpython/pystate.h, frameobject.h,
    // code.h, internal/pycore_runtime.h and pycore_interp.h). Frames are heap objects linked by
    // f_back, each run by a _PyEval_EvalFrameDefault of its own; a thread state keeps its
    // thread's pthread_t, not its kernel tid; code objects have no qualname (co_name instead).
    PythonLayout{3, 10,
                 gs_py_offsets{
                     .runtime_interp_head = 32, .interp_threads_head = 8, .tstate_next = 8,
                     .tstate_native_thread_id = 176, .tstate_cframe = kNone, .current_frame = 24,
                     .frame_code = 32, .frame_previous = 24, .frame_instr = 96, .frame_is_entry = kNone,
                     .frame_owner = kNone, .owner_cstack = 0, .code_firstlineno = 40, .code_filename = 104,
                     .code_qualname = 112, .code_linetable = 120, .unicode_ascii_data = 48, .bytes_data = 32,
                     .flags = GS_PY_THREAD_ID_IS_PTHREAD | GS_PY_FRAME_PER_EVAL},
                 0, 72, false, true},
    PythonLayout{3, 11,
                 gs_py_offsets{
                     .runtime_interp_head = 40, .interp_threads_head = 16, .tstate_next = 8,
                     .tstate_native_thread_id = 160, .tstate_cframe = 56, .current_frame = 8,
                     .frame_code = 32, .frame_previous = 48, .frame_instr = 56, .frame_is_entry = 68,
                     .frame_owner = kNone, .owner_cstack = 0, .code_firstlineno = 72, .code_filename = 112,
                     .code_qualname = 128, .code_linetable = 136, .unicode_ascii_data = 48, .bytes_data = 32},
                 184, 72, false},
    PythonLayout{3, 12,
                 gs_py_offsets{
                     .runtime_interp_head = 40, .interp_threads_head = 72, .tstate_next = 8,
                     .tstate_native_thread_id = 144, .tstate_cframe = 56, .current_frame = 0,
                     .frame_code = 0, .frame_previous = 8, .frame_instr = 56, .frame_is_entry = kNone,
                     .frame_owner = 70, .owner_cstack = 3, .code_firstlineno = 68, .code_filename = 112,
                     .code_qualname = 128, .code_linetable = 136, .unicode_ascii_data = 40, .bytes_data = 32},
                 192, 56, false},
};

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Py_Version (3.11+) holds PY_VERSION_HEX: major, minor and micro in its top three bytes.
bool read_py_version(const std::string& open_path, const elf::ElfFile& elf, const elf::ElfObject& sym,
                     PythonBinary& out) {
  auto off = elf.vaddr_to_offset(sym.vaddr);
  if (!off) return false;
  const int fd = ::open(open_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint32_t hex = 0;
  const bool ok = pread(fd, &hex, sizeof(hex), static_cast<off_t>(*off)) == sizeof(hex);
  ::close(fd);
  if (!ok) return false;
  out.major = int(hex >> 24);
  out.minor = int((hex >> 16) & 0xff);
  out.micro = int((hex >> 8) & 0xff);
  return out.major == 3;
}

// Before 3.11 the version is in the file's name only: python3.10, libpython3.10.so.1.0.
bool version_from_name(const std::string& path, PythonBinary& out) {
  static const std::regex re(R"(^(?:lib)?python(\d)\.(\d+))");
  std::smatch m;
  const std::string name = base_name(path);
  if (!std::regex_search(name, m, re)) return false;
  out.major = std::stoi(m[1]);
  out.minor = std::stoi(m[2]);
  out.micro = -1;  // not in the name
  return true;
}

// 3.13 begins _PyRuntime with _Py_DebugOffsets (for debuggers and profilers): the offsets
// gpuscope walks, as the interpreter was built. The words of 3.13's struct that gpuscope reads
// (Include/internal/pycore_runtime.h; checked against tools/python_offsets.py on 3.13.0).
namespace debug_offsets_313 {
constexpr char kCookie[8] = {'x', 'd', 'e', 'b', 'u', 'g', 'p', 'y'};
enum Word : size_t {
  kVersion = 1,
  kRuntimeInterpretersHead = 5,
  kInterpThreadsHead = 9,
  kThreadNext = 21,
  kThreadCurrentFrame = 23,
  kThreadNativeId = 25,
  kFramePrevious = 29,
  kFrameExecutable = 30,
  kFrameInstrPtr = 31,
  kFrameOwner = 33,
  kCodeFilename = 35,
  kCodeQualname = 37,
  kCodeLinetable = 38,
  kCodeFirstlineno = 39,
  kCodeAdaptive = 43,
  kBytesSval = 66,
  kUnicodeAsciiSize = 70,
  kWords = 71,
};
}  // namespace debug_offsets_313

std::shared_ptr<const PythonLayout> layout_from_debug_offsets(const std::string& open_path, const PythonBinary& b) {
  namespace d = debug_offsets_313;
  if (b.major != 3 || b.minor != 13) return nullptr;
  std::array<uint64_t, d::kWords> w{};
  const int fd = ::open(open_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  const ssize_t n = pread(fd, w.data(), sizeof(w), static_cast<off_t>(b.runtime_offset));
  ::close(fd);
  if (n != ssize_t(sizeof(w)) || std::memcmp(w.data(), d::kCookie, sizeof(d::kCookie)) != 0 ||
      ((w[d::kVersion] >> 16) & 0xffff) != 0x030d)
    return nullptr;
  const size_t fields[] = {d::kRuntimeInterpretersHead, d::kInterpThreadsHead, d::kThreadNext, d::kThreadCurrentFrame,
                           d::kThreadNativeId, d::kFramePrevious, d::kFrameExecutable, d::kFrameInstrPtr,
                           d::kFrameOwner, d::kCodeFilename, d::kCodeQualname, d::kCodeLinetable,
                           d::kCodeFirstlineno, d::kCodeAdaptive, d::kBytesSval, d::kUnicodeAsciiSize};
  for (size_t f : fields)
    if (w[f] >= GS_PY_NONE) return nullptr;  // not an offset the BPF side can hold
  auto u16 = [&](size_t i) { return uint16_t(w[i]); };
  auto l = std::make_shared<PythonLayout>();
  l->major = 3;
  l->minor = 13;
  l->bpf = gs_py_offsets{
      .runtime_interp_head = u16(d::kRuntimeInterpretersHead), .interp_threads_head = u16(d::kInterpThreadsHead),
      .tstate_next = u16(d::kThreadNext), .tstate_native_thread_id = u16(d::kThreadNativeId),
      .tstate_cframe = kNone, .current_frame = u16(d::kThreadCurrentFrame), .frame_code = u16(d::kFrameExecutable),
      .frame_previous = u16(d::kFramePrevious), .frame_instr = u16(d::kFrameInstrPtr), .frame_is_entry = kNone,
      .frame_owner = u16(d::kFrameOwner), .owner_cstack = 3 /* FRAME_OWNED_BY_CSTACK */,
      .code_firstlineno = u16(d::kCodeFirstlineno), .code_filename = u16(d::kCodeFilename),
      .code_qualname = u16(d::kCodeQualname), .code_linetable = u16(d::kCodeLinetable),
      .unicode_ascii_data = u16(d::kUnicodeAsciiSize), .bytes_data = u16(d::kBytesSval)};
  l->code_adaptive = u16(d::kCodeAdaptive);
  // PyCompactUnicodeObject: PyASCIIObject, then utf8_length and utf8.
  l->unicode_compact_data = uint16_t(w[d::kUnicodeAsciiSize] + 16);
  // instr_ptr is the instruction running, as prev_instr was (_PyInterpreterFrame_LASTI).
  l->instr_is_next = false;
  return l;
}

}  // namespace

const PythonLayout* python_layout(int major, int minor) {
  for (const auto& l : kLayouts)
    if (l.major == major && l.minor == minor) return &l;
  return nullptr;
}

std::string supported_python_versions() {
  std::string out;
  for (const auto& l : kLayouts) out += (out.empty() ? "" : ", ") + std::to_string(l.major) + "." + std::to_string(l.minor);
  return out + ", 3.13";  // 3.13: from the interpreter's _Py_DebugOffsets
}

bool looks_like_python(const std::string& path) {
  static const std::regex re(R"(^(python\d(\.\d+)?[a-z]*|libpython\d\.\d+[a-z]*\.so.*)$)");
  return std::regex_match(base_name(path), re);
}

std::optional<PythonBinary> inspect_python_binary(const std::string& open_path, const std::string& path) {
  try {
    auto objects = elf::object_symbols(open_path, {"_PyRuntime", "Py_Version"});
    auto runtime = objects.find("_PyRuntime");
    if (runtime == objects.end()) return std::nullopt;
    auto elf = elf::ElfFile::open(open_path);
    PythonBinary b;
    b.path = path;
    auto version = objects.find("Py_Version");
    if (!(version != objects.end() && read_py_version(open_path, *elf, version->second, b)) &&
        !version_from_name(path, b))
      return std::nullopt;
    auto runtime_off = elf->vaddr_to_offset(runtime->second.vaddr);
    if (!runtime_off) return std::nullopt;
    b.runtime_offset = *runtime_off;
    auto eval = elf->function_offsets({"_PyEval_EvalFrameDefault"});
    if (auto it = eval.find("_PyEval_EvalFrameDefault"); it != eval.end()) {
      auto sym = elf->symbolize(it->second);
      b.eval_begin = it->second;
      b.eval_end = it->second + (sym && sym->first.size ? sym->first.size : 1);
    }
    if (const PythonLayout* known = python_layout(b.major, b.minor))
      b.layout = std::shared_ptr<const PythonLayout>(std::shared_ptr<const PythonLayout>(), known);  // static
    else
      b.layout = layout_from_debug_offsets(open_path, b);
    return b;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<PythonProcess> find_python(const std::vector<Mapping>& maps,
                                         const std::function<std::optional<PythonBinary>(const Mapping&)>& inspect) {
  std::string tried;
  for (const auto& m : maps) {
    if (m.path.empty() || m.path == tried || !looks_like_python(m.path)) continue;
    tried = m.path;
    auto b = inspect(m);
    if (!b) continue;
    // _PyRuntime is initialised data: a mapping of the file covers its offset.
    for (const auto& d : maps)
      if (d.path == m.path && b->runtime_offset >= d.offset && b->runtime_offset - d.offset < d.end - d.start)
        return PythonProcess{*b, d.start + (b->runtime_offset - d.offset)};
  }
  return std::nullopt;
}

}  // namespace gpuscope::discover
