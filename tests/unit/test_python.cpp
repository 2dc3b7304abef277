// Python frames: line tables, interpreter files and their layouts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "discover/python.h"
#include "symbolize/python_frames.h"

using namespace gpuscope;

namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += char(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

}  // namespace

// The co_linetable CPython 3.11.2 made for
//   def f(x):               # line 2
//       y = x + 1
//       if y:
//           return [i for i in range(3)]
//       return y
// and what code.co_lines() says of it: (start byte, end byte, line).
TEST(PythonLine, FollowsTheLocationTable) {
  const std::string table = from_hex(
      "8000d80809884189058041d80708f000010525d80f24d00f249d35a01199389c38d00f24d10f24d40f24d00824d80b0c8048");
  const struct {
    int start, end, line;
  } lines[] = {{0, 2, 2},   {2, 4, 3},   {4, 6, 3},   {6, 10, 3},  {10, 12, 3}, {12, 14, 4}, {14, 16, 4},
               {16, 18, 5}, {18, 20, 5}, {20, 32, 5}, {32, 34, 5}, {34, 38, 5}, {38, 48, 5}, {48, 50, 5},
               {50, 54, 5}, {54, 64, 5}, {64, 66, 5}, {66, 68, 6}, {68, 70, 6}};
  for (const auto& l : lines)
    for (int byte = l.start; byte < l.end; byte += 2)
      EXPECT_EQ(symbolize::python_line(table, 2, byte / 2), l.line) << "instruction at byte " << byte;
  // Before the first instruction (a frame that has not started), and with no table at all.
  EXPECT_EQ(symbolize::python_line(table, 2, -1), 2);
  EXPECT_EQ(symbolize::python_line("", 7, 3), 7);
}

// The co_linetable CPython 3.10.13 made for
//   def f(x):               # line 2
//       y = x + 1
//
//       if y:
//           z = [i
//                for i in range(3)]
//       return y
// ((bytecode bytes, line delta) pairs), and what its co_lines() says: (start byte, end byte, line).
TEST(PythonLine, Follows310sLineTable) {
  const std::string table = from_hex("080104020601060106ff0402");
  const struct {
    int start, end, line;
  } lines[] = {{0, 8, 3}, {8, 12, 5}, {12, 18, 6}, {18, 24, 7}, {24, 30, 6}, {30, 34, 8}};
  for (const auto& l : lines)
    for (int byte = l.start; byte < l.end; byte += 2)
      EXPECT_EQ(symbolize::python310_line(table, 2, byte / 2), l.line) << "instruction at byte " << byte;
  EXPECT_EQ(symbolize::python310_line(table, 2, -1), 2);  // f_lasti before the first instruction
  // -128: bytes without a line; the line after them goes on from the last one.
  const std::string gap = from_hex("04010480040a");
  EXPECT_EQ(symbolize::python310_line(gap, 10, 0), 11);
  EXPECT_EQ(symbolize::python310_line(gap, 10, 2), 10);
  EXPECT_EQ(symbolize::python310_line(gap, 10, 4), 21);
}

TEST(PythonLine, LongAndNoColumnForms) {
  // Code 14 (long form): 1 unit, line +5, then end line, column, end column; code 13 (no
  // columns): 2 units, line -2 (svarint 5 = -2); code 15: no location.
  std::string t;
  t += char(0x80 | (14 << 3) | 0);
  t += char(10);  // +5
  t += char(0);
  t += char(1);
  t += char(2);
  t += char(0x80 | (13 << 3) | 1);
  t += char(5);  // -2
  t += char(0x80 | (15 << 3) | 0);
  EXPECT_EQ(symbolize::python_line(t, 100, 0), 105);
  EXPECT_EQ(symbolize::python_line(t, 100, 1), 103);
  EXPECT_EQ(symbolize::python_line(t, 100, 2), 103);
  EXPECT_EQ(symbolize::python_line(t, 100, 3), 100);  // no location: the function's first line
}

TEST(PythonBinary, NamesThatLookLikeInterpreters) {
  for (const char* yes : {"/usr/bin/python3.11", "/usr/bin/python3", "/opt/py/lib/libpython3.12.so.1.0",
                          "/x/libpython3.13t.so", "python3.12d"})
    EXPECT_TRUE(discover::looks_like_python(yes)) << yes;
  for (const char* no : {"/usr/bin/pythonista", "/usr/lib/libpython-helper.so", "/usr/bin/ipython3",
                         "/lib/_ctypes.cpython-311-x86_64-linux-gnu.so"})
    EXPECT_FALSE(discover::looks_like_python(no)) << no;
}

TEST(PythonBinary, LayoutsForTheVersionsWalked) {
  ASSERT_NE(discover::python_layout(3, 10), nullptr);
  ASSERT_NE(discover::python_layout(3, 11), nullptr);
  ASSERT_NE(discover::python_layout(3, 12), nullptr);
  EXPECT_EQ(discover::python_layout(3, 9), nullptr);
  // 3.10 runs each frame in a C call of its own and knows threads by pthread_t; 3.11 marks
  // entry frames itself; 3.12 puts a shim frame under them.
  const auto* py310 = discover::python_layout(3, 10);
  EXPECT_EQ(py310->bpf.flags, GS_PY_THREAD_ID_IS_PTHREAD | GS_PY_FRAME_PER_EVAL);
  EXPECT_TRUE(py310->lasti_index);
  EXPECT_EQ(discover::python_layout(3, 11)->bpf.flags, 0);
  EXPECT_NE(discover::python_layout(3, 11)->bpf.frame_is_entry, GS_PY_NONE);
  EXPECT_EQ(discover::python_layout(3, 12)->bpf.frame_owner, 70);
  EXPECT_EQ(discover::supported_python_versions(), "3.10, 3.11, 3.12, 3.13");
}

TEST(PythonBinary, ReadsPython313sOffsetsFromTheInterpreter) {
  // pyenv's 3.13.0 where this machine has it (CI's Debian 12 does not).
  const std::string path = std::string(getenv("HOME") ? getenv("HOME") : "/root") +
                           "/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0";
  if (access(path.c_str(), R_OK) != 0) GTEST_SKIP() << path << " is not installed";
  auto b = discover::inspect_python_binary(path, path);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->minor, 13);
  ASSERT_NE(b->layout, nullptr);
  // What tools/python_offsets.py finds in the live 3.13.0 interpreter.
  const gs_py_offsets& o = b->layout->bpf;
  EXPECT_EQ(o.runtime_interp_head, 632);
  EXPECT_EQ(o.interp_threads_head, 7344);
  EXPECT_EQ(o.tstate_next, 8);
  EXPECT_EQ(o.tstate_native_thread_id, 160);
  EXPECT_EQ(o.tstate_cframe, GS_PY_NONE);
  EXPECT_EQ(o.current_frame, 72);
  EXPECT_EQ(o.frame_code, 0);
  EXPECT_EQ(o.frame_previous, 8);
  EXPECT_EQ(o.frame_instr, 56);
  EXPECT_EQ(o.frame_owner, 70);
  EXPECT_EQ(o.code_filename, 112);
  EXPECT_EQ(o.code_qualname, 128);
  EXPECT_EQ(o.code_linetable, 136);
  EXPECT_EQ(o.code_firstlineno, 68);
  EXPECT_EQ(o.unicode_ascii_data, 40);
  EXPECT_EQ(o.bytes_data, 32);
  EXPECT_EQ(b->layout->code_adaptive, 200);
}

TEST(PythonBinary, ReadsDebiansInterpreter) {
  const char* path = "/usr/bin/python3.11";
  if (access(path, R_OK) != 0) GTEST_SKIP() << path << " is not installed";
  auto b = discover::inspect_python_binary(path, path);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->major, 3);
  EXPECT_EQ(b->minor, 11);  // from Py_Version in the file
  ASSERT_NE(b->layout, nullptr);
  EXPECT_GT(b->runtime_offset, 0u);
  EXPECT_GT(b->eval_end, b->eval_begin + 1000);  // _PyEval_EvalFrameDefault is large
  // Not an interpreter: no _PyRuntime.
  EXPECT_FALSE(discover::inspect_python_binary("/proc/self/exe", "/proc/self/exe").has_value());
  EXPECT_FALSE(discover::inspect_python_binary("/nonexistent", "/nonexistent").has_value());
}

namespace {
// A one-frame stack record for PythonFrames::on_stack.
std::vector<uint8_t> py_stack_record(uint64_t id, uint64_t code) {
  gs_py_stack_record rec{};
  rec.kind = GS_REC_PY_STACK;
  rec.id = id;
  rec.pid = 1;
  rec.depth = 1;
  rec.frames[0].code = code;
  const size_t size = offsetof(gs_py_stack_record, frames) + sizeof(gs_py_frame);
  const auto* p = reinterpret_cast<const uint8_t*>(&rec);
  return {p, p + size};
}
}  // namespace

TEST(PythonFrames, KeepsTheGenerationBeforeAndForgetsOlderOnes) {
  symbolize::PythonFrames py;
  auto first = py_stack_record(11, 0x1000), second = py_stack_record(22, 0x2000);
  py.on_stack(first.data(), first.size());
  EXPECT_EQ(py.stacks_held(), 1u);
  py.new_generation();
  EXPECT_EQ(py.stacks_held(), 0u);
  py.on_stack(second.data(), second.size());
  // Records already under way when the generation changed still find their stacks.
  ASSERT_NE(py.sent(11), nullptr);
  EXPECT_EQ(py.sent(11)->frames.size(), 1u);
  EXPECT_EQ(py.sent(11)->frames[0].code, 0x1000u);
  ASSERT_NE(py.sent(22), nullptr);
  py.new_generation();
  EXPECT_EQ(py.sent(11), nullptr);
  EXPECT_NE(py.sent(22), nullptr);
  EXPECT_EQ(py.sent(33), nullptr);
}

namespace {
gs_py_code_record py_code_record(uint64_t code, const char* qualname) {
  gs_py_code_record rec{};
  rec.kind = GS_REC_PY_CODE;
  rec.pid = 1;
  rec.code = code;
  rec.firstlineno = 7;
  rec.flags = GS_PY_CODE_NAME_OK | GS_PY_CODE_FILE_OK | GS_PY_CODE_LINETABLE_OK;
  std::snprintf(rec.qualname, sizeof(rec.qualname), "%s", qualname);
  std::snprintf(rec.filename, sizeof(rec.filename), "m.py");
  return rec;
}
}  // namespace

TEST(PythonFrames, ACodeObjectMadeWhereAFreedOneWasHasItsOwnName) {
  // A module's code object freed once it ran, and a function's made at its address: frames of
  // each, told apart by their tags, keep their own names; the older one, no longer known, is
  // never named as the newer.
  symbolize::PythonFrames py;
  const uint64_t addr = 0x7f0000001230, first = addr | (1ULL << GS_PY_CODE_TAG_SHIFT),
                 second = addr | (2ULL << GS_PY_CODE_TAG_SHIFT);
  py.on_code(py_code_record(first, "<module>"));
  EXPECT_EQ(py.name(1, nullptr, gs_py_frame{first | GS_PY_FRAME_ENTRY, 0}).function, "<module>");
  py.on_code(py_code_record(second, "from_native"));
  const auto named = py.name(1, nullptr, gs_py_frame{second, 0});
  EXPECT_EQ(named.function, "from_native");
  EXPECT_EQ(named.file, "m.py");
  EXPECT_EQ(py.name(1, nullptr, gs_py_frame{first, 0}).function, "[python code unreadable]");
}

namespace {
// A compact ASCII str as CPython lays it out: length at 16, state at 32, characters after the head.
struct FakeStr {
  alignas(16) uint8_t bytes[96] = {};
  FakeStr(const discover::PythonLayout& layout, const char* text) {
    const uint64_t length = std::strlen(text);
    const uint32_t state = (1u << 2) | (1u << 5) | (1u << 6);  // kind 1, compact, ascii
    std::memcpy(bytes + 16, &length, sizeof(length));
    std::memcpy(bytes + 32, &state, sizeof(state));
    std::memcpy(bytes + layout.bpf.unicode_ascii_data, text, length + 1);
  }
  uint64_t address() const { return reinterpret_cast<uint64_t>(bytes); }
};
}  // namespace

TEST(PythonFrames, AnOlderCodeObjectIsNeverNamedFromTheNewerOneAtItsAddress) {
  // A frame's record lost, and its code object's address holding another object by the time
  // it is named: what the process holds now is not that frame's name.
  const auto* layout = discover::python_layout(3, 12);
  ASSERT_NE(layout, nullptr);
  const auto& o = layout->bpf;
  ASSERT_LT(o.unicode_ascii_data + 16u, sizeof(FakeStr::bytes));
  FakeStr module(*layout, "<module>"), function(*layout, "from_native"), file(*layout, "m.py");
  alignas(16) static uint8_t code[256];
  auto put = [&](const FakeStr& qualname, uint32_t firstlineno) {
    std::memset(code, 0, sizeof(code));
    const uint64_t q = qualname.address(), f = file.address();
    std::memcpy(code + o.code_qualname, &q, sizeof(q));
    std::memcpy(code + o.code_filename, &f, sizeof(f));
    std::memcpy(code + o.code_firstlineno, &firstlineno, sizeof(firstlineno));
    return gs_py_code_tag(q, f, 0, firstlineno);
  };
  const uint64_t addr = reinterpret_cast<uint64_t>(code);
  const pid_t self = getpid();
  const uint16_t first = put(module, 1);
  symbolize::PythonFrames py;
  const auto named = py.name(self, layout, gs_py_frame{addr | uint64_t(first) << GS_PY_CODE_TAG_SHIFT, 0});
  EXPECT_EQ(named.function, "<module>");
  EXPECT_EQ(named.file, "m.py");

  const uint16_t second = put(function, 3);
  ASSERT_NE(first, second);
  EXPECT_EQ(py.name(self, layout, gs_py_frame{addr | uint64_t(second) << GS_PY_CODE_TAG_SHIFT, 0}).function,
            "from_native");
  // The first object is known no more (the address now names the second), and the process
  // holds the second: the older frame is unreadable, not "from_native".
  symbolize::PythonFrames fresh;
  EXPECT_EQ(fresh.name(self, layout, gs_py_frame{addr | uint64_t(first) << GS_PY_CODE_TAG_SHIFT, 0}).function,
            "[python code unreadable]");
}
