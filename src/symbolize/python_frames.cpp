#include "symbolize/python_frames.h"

#include <sys/uio.h>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <limits>

#include "discover/proc.h"

namespace gpuscope::symbolize {
namespace {

// Location-table varints: 6 bits per byte, bit 6 set while more follow.
uint32_t read_varint(const std::string& t, size_t& at) {
  uint32_t v = 0;
  for (int shift = 0; at < t.size() && shift < 32; shift += 6) {
    const uint8_t b = static_cast<uint8_t>(t[at++]);
    v |= uint32_t(b & 0x3f) << shift;
    if (!(b & 0x40)) break;
  }
  return v;
}

int32_t read_svarint(const std::string& t, size_t& at) {
  const uint32_t u = read_varint(t, at);
  return (u & 1) ? -int32_t(u >> 1) : int32_t(u >> 1);
}

bool read_remote(pid_t pid, uint64_t addr, void* dst, size_t n) {
  iovec local{dst, n}, remote{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

template <class T>
bool read_value(pid_t pid, uint64_t addr, T& out) {
  return read_remote(pid, addr, &out, sizeof(out));
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xc0 | (c >> 6));
    out += char(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += char(0xe0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  } else {
    out += char(0xf0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3f));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  }
}

// A compact str object of the process as UTF-8 (PyASCIIObject: length at +16, state at +32).
std::optional<std::string> read_str(pid_t pid, uint64_t obj, const discover::PythonLayout& layout) {
  uint64_t length = 0;
  uint32_t state = 0;
  if (!obj || !read_value(pid, obj + 16, length) || !read_value(pid, obj + 32, state) || length > 4096)
    return std::nullopt;
  const unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  if (!compact || (kind != 1 && kind != 2 && kind != 4)) return std::nullopt;
  const uint64_t data = obj + (ascii ? layout.bpf.unicode_ascii_data : layout.unicode_compact_data);
  std::string raw(length * kind, '\0');
  if (length && !read_remote(pid, data, raw.data(), raw.size())) return std::nullopt;
  if (ascii) return raw;
  std::string out;
  for (uint64_t i = 0; i < length; ++i) {
    uint32_t c = 0;
    std::memcpy(&c, raw.data() + i * kind, kind);
    append_utf8(out, c);
  }
  return out;
}

// Names read from another process's memory are checked: anything that is not UTF-8 (a stale
// object) is replaced byte by byte with U+FFFD, so that no output format gets invalid text.
std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size() && !(n == 1 && c == 0);
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<uint8_t>(s[i + k]) & 0xc0) == 0x80;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

}  // namespace

// Tables and first lines come from the target's memory: lines are summed wide and given back
// within int's range.
int as_line(int64_t line) {
  return int(std::clamp<int64_t>(line, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

int python310_line(const std::string& t, int firstlineno, int64_t index) {
  if (index < 0) return firstlineno;  // f_lasti is -1 before the first instruction
  // The table counts bytes of bytecode (an index past any table's end is past its end).
  const int64_t offset = index > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max() : index * 2;
  int64_t line = firstlineno;
  int64_t end = 0;
  for (size_t at = 0; at + 1 < t.size(); at += 2) {
    const int64_t start = end;
    end += static_cast<uint8_t>(t[at]);
    const int8_t delta = static_cast<int8_t>(t[at + 1]);
    // -128: these bytes have no line; the line goes on from where it was.
    if (delta != -128) line += delta;
    if (offset >= start && offset < end) return delta == -128 ? firstlineno : as_line(line);
  }
  return as_line(line);
}

int python_line(const std::string& t, int firstlineno, int64_t index) {
  if (index < 0) return firstlineno;
  int64_t line = firstlineno;
  int64_t at_unit = 0;
  size_t at = 0;
  while (at < t.size()) {
    const uint8_t first = static_cast<uint8_t>(t[at++]);
    if (!(first & 0x80)) break;  // out of step with the table: keep the last line known
    const unsigned code = (first >> 3) & 15;
    const int64_t units = (first & 7) + 1;
    int64_t entry_line = line;
    bool has_line = true;
    switch (code) {
      case 15:  // no location
        has_line = false;
        break;
      case 14:  // long form: line delta, end line delta, column, end column
        entry_line = line + read_svarint(t, at);
        read_varint(t, at);
        read_varint(t, at);
        read_varint(t, at);
        break;
      case 13:  // no columns: line delta only
        entry_line = line + read_svarint(t, at);
        break;
      case 10:
      case 11:
      case 12:  // one line: the delta is in the code, two column bytes follow
        entry_line = line + int(code - 10);
        at += 2;
        break;
      default:  // short form: same line, one column byte
        at += 1;
        break;
    }
    if (has_line) line = entry_line;
    if (index < at_unit + units) return has_line ? as_line(line) : firstlineno;
    at_unit += units;
  }
  return as_line(line);
}

void PythonFrames::add_process(pid_t pid, const discover::PythonProcess& p) {
  std::lock_guard lock(mu_);
  processes_[pid] = p;
  generation_.fetch_add(1, std::memory_order_relaxed);
}

void PythonFrames::forget(pid_t pid) {
  std::lock_guard lock(mu_);
  processes_.erase(pid);
  codes_.erase(codes_.lower_bound({pid, 0}), codes_.upper_bound({pid, UINT64_MAX}));
  generation_.fetch_add(1, std::memory_order_relaxed);
}

void PythonFrames::on_fork(pid_t parent, pid_t child) {
  std::lock_guard lock(mu_);
  if (auto it = processes_.find(parent); it != processes_.end()) processes_[child] = it->second;
  generation_.fetch_add(1, std::memory_order_relaxed);
}

std::optional<discover::PythonProcess> PythonFrames::process(pid_t pid) {
  std::lock_guard lock(mu_);
  if (auto it = processes_.find(pid); it != processes_.end()) return it->second;
  // A child whose fork record was lost, asked while it lives.
  const pid_t parent = discover::read_ppid(pid);
  if (auto it = processes_.find(parent); parent > 0 && it != processes_.end()) {
    processes_[pid] = it->second;
    return it->second;
  }
  return std::nullopt;
}

bool PythonFrames::read_from_process(pid_t pid, uint64_t addr, const discover::PythonLayout& layout, Code& code,
                                     uint16_t have, uint16_t tag) {
  uint8_t obj[256];
  if (!read_remote(pid, addr, obj, sizeof(obj))) return false;
  auto ptr = [&](uint16_t off) {
    uint64_t v = 0;
    std::memcpy(&v, obj + (off & 255), sizeof(v));
    return v;
  };
  const auto& o = layout.bpf;
  uint32_t firstlineno = 0;
  std::memcpy(&firstlineno, obj + (o.code_firstlineno & 255), sizeof(firstlineno));
  // The address may hold another object by now: its names are not this frame's.
  const uint16_t found = gs_py_code_tag(ptr(o.code_qualname), ptr(o.code_filename), ptr(o.code_linetable), firstlineno);
  if (tag && found != tag) return false;
  code.tag = found;
  code.firstlineno = int32_t(firstlineno);
  if (!(have & GS_PY_CODE_NAME_OK))
    if (auto s = read_str(pid, ptr(o.code_qualname), layout)) code.qualname = *s;
  if (!(have & GS_PY_CODE_FILE_OK))
    if (auto s = read_str(pid, ptr(o.code_filename), layout)) code.filename = *s;
  if (!(have & GS_PY_CODE_LINETABLE_OK)) {
    const uint64_t table = ptr(o.code_linetable);
    uint64_t len = 0;
    if (table && read_value(pid, table + 16, len) && len < (1u << 20)) {
      code.linetable.resize(len);
      if (!read_remote(pid, table + o.bytes_data, code.linetable.data(), len)) code.linetable.clear();
    }
  }
  return true;
}

void PythonFrames::on_code(const gs_py_code_record& rec) {
  Code c;
  c.firstlineno = rec.firstlineno;
  if (rec.flags & GS_PY_CODE_NAME_OK) c.qualname.assign(rec.qualname, strnlen(rec.qualname, sizeof(rec.qualname)));
  if (rec.flags & GS_PY_CODE_FILE_OK) c.filename.assign(rec.filename, strnlen(rec.filename, sizeof(rec.filename)));
  if (rec.flags & GS_PY_CODE_LINETABLE_OK)
    c.linetable.assign(reinterpret_cast<const char*>(rec.linetable), std::min<size_t>(rec.linetable_len, GS_PY_LINETABLE_LEN));
  const auto want = GS_PY_CODE_NAME_OK | GS_PY_CODE_FILE_OK | GS_PY_CODE_LINETABLE_OK;
  c.tag = uint16_t(rec.code >> GS_PY_CODE_TAG_SHIFT);
  if ((rec.flags & want) != want)
    if (const auto layout = layout_of(static_cast<pid_t>(rec.pid))) {
      Code filled = c;
      if (read_from_process(static_cast<pid_t>(rec.pid), rec.code & GS_PY_CODE_ADDRESS_MASK, *layout, filled,
                            rec.flags, c.tag)) {
        filled.firstlineno = c.firstlineno;
        c = std::move(filled);
      }
    }
  codes_[{static_cast<pid_t>(rec.pid), rec.code & GS_PY_CODE_ADDRESS_MASK}] = std::move(c);
}

void PythonFrames::on_stack(const uint8_t* data, size_t size) {
  gs_py_stack_record head;
  const size_t head_size = offsetof(gs_py_stack_record, frames);
  if (size < head_size) return;
  std::memcpy(&head, data, head_size);
  const size_t depth = std::min<size_t>({head.depth, GS_MAX_PY_FRAMES, (size - head_size) / sizeof(gs_py_frame)});
  SentStack s;
  s.pid = static_cast<pid_t>(head.pid);
  s.truncated = head.flags & GS_PY_STACK_TRUNCATED;
  s.frames.resize(depth);
  if (depth) std::memcpy(s.frames.data(), data + head_size, depth * sizeof(gs_py_frame));
  current_[head.id] = std::move(s);
}

void PythonFrames::new_generation() {
  previous_ = std::move(current_);
  current_.clear();
}

PythonFrame PythonFrames::name(pid_t pid, const discover::PythonLayout* layout, const gs_py_frame& f) {
  const uint64_t code_addr = f.code & GS_PY_CODE_ADDRESS_MASK;
  const auto tag = uint16_t(f.code >> GS_PY_CODE_TAG_SHIFT);
  PythonFrame out;
  out.entry = f.code & GS_PY_FRAME_ENTRY;
  auto it = codes_.find({pid, code_addr});
  const Code* found = it != codes_.end() && (it->second.tag == tag || !tag) ? &it->second : nullptr;
  Code asked;
  if (!found && layout && read_from_process(pid, code_addr, *layout, asked, 0, tag)) {
    // Its record was lost, or came after a newer object at its address: the process may still
    // hold it to ask, if the address holds that object still. What it answers is kept only
    // where nothing newer is.
    if (it == codes_.end())
      found = &codes_.emplace(std::pair{pid, code_addr}, std::move(asked)).first->second;
    else
      found = &asked;
  }
  if (!found || found->qualname.empty()) {
    ++unnamed_;
    out.function = "[python code unreadable]";
    return out;
  }
  const Code& c = *found;
  out.function = valid_utf8(c.qualname);
  out.file = valid_utf8(c.filename);
  out.line = c.firstlineno;
  if (layout && layout->lasti_index) {
    out.line = python310_line(c.linetable, c.firstlineno, int32_t(uint32_t(f.instr)));
  } else if (layout) {
    const uint64_t start = code_addr + layout->code_adaptive;
    // Two bytes per code unit; the instruction being run sits one before a next-instruction pointer.
    int64_t index = f.instr >= start ? int64_t((f.instr - start) / 2) : -1;
    if (layout->instr_is_next && index > 0) --index;
    out.line = python_line(c.linetable, c.firstlineno, index);
  }
  return out;
}

const PythonFrames::SentStack* PythonFrames::sent(uint64_t id) const {
  if (auto it = current_.find(id); it != current_.end()) return &it->second;
  if (auto it = previous_.find(id); it != previous_.end()) return &it->second;
  return nullptr;
}

std::shared_ptr<const discover::PythonLayout> PythonFrames::layout_of(pid_t pid) {
  std::lock_guard lock(mu_);
  auto it = processes_.find(pid);
  return it == processes_.end() ? nullptr : it->second.binary.layout;
}

bool PythonFrames::is_eval_loop(pid_t pid, const std::string& path, uint64_t file_offset) {
  auto p = process(pid);
  return p && p->binary.path == path && file_offset >= p->binary.eval_begin && file_offset < p->binary.eval_end;
}

}  // namespace gpuscope::symbolize
