// Unwind tables (src/symbolize/unwind_table.h) against two unwinders that do not use them:
// libdw's own reading of the same CFI at every row of real libraries (its rules evaluated by a
// separate evaluator), and libgcc's walk of this test's own stack.
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "discover/proc.h"
#include "symbolize/unwind_table.h"

using namespace gpuscope::symbolize;

namespace {

// A stack memory that answers every address: a value derived from the address, so that a
// wrong address gives a wrong value.
uint64_t fake_word(uint64_t addr) { return (addr * 0x9e3779b97f4a7c15ULL) ^ 0x5555; }

// A DWARF expression evaluator for the operations CFI uses on x86-64, written apart from the
// table compiler: the reference the rows are checked against.
std::optional<uint64_t> eval(const Dwarf_Op* ops, size_t n, const uint64_t regs[17], std::optional<uint64_t> cfa) {
  std::vector<uint64_t> st;
  if (cfa) st.push_back(*cfa);
  for (size_t i = 0; i < n; ++i) {
    const Dwarf_Op& op = ops[i];
    auto pop = [&] {
      uint64_t v = st.back();
      st.pop_back();
      return v;
    };
    if (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg16) {
      st.push_back(regs[op.atom - DW_OP_breg0] + op.number);
    } else if (op.atom == DW_OP_bregx) {
      if (op.number > 16) return std::nullopt;
      st.push_back(regs[op.number] + op.number2);
    } else if (op.atom >= DW_OP_lit0 && op.atom <= DW_OP_lit31) {
      st.push_back(op.atom - DW_OP_lit0);
    } else if (op.atom == DW_OP_call_frame_cfa) {
      if (!cfa) return std::nullopt;
      st.push_back(*cfa);
    } else if (op.atom == DW_OP_plus_uconst) {
      if (st.empty()) return std::nullopt;
      st.back() += op.number;
    } else if (op.atom == DW_OP_deref) {
      if (st.empty()) return std::nullopt;
      st.back() = fake_word(st.back());
    } else if (op.atom == DW_OP_and || op.atom == DW_OP_ge || op.atom == DW_OP_shl || op.atom == DW_OP_plus) {
      if (st.size() < 2) return std::nullopt;
      const uint64_t b = pop(), a = pop();
      st.push_back(op.atom == DW_OP_and ? a & b
                   : op.atom == DW_OP_ge ? uint64_t(int64_t(a) >= int64_t(b))
                   : op.atom == DW_OP_shl ? a << b
                                          : a + b);
    } else {
      return std::nullopt;  // not an operation the walker could follow either
    }
  }
  if (st.empty()) return std::nullopt;
  return st.back();
}

struct Checked {
  size_t addresses = 0, agreed = 0, both_unsupported = 0;
};

// At addresses of every row (its first, second and last byte), what the row makes the walker do
// must be what libdw's rules say: the same CFA, return address and caller's rbp.
Checked check_against_libdw(const std::string& path) {
  const UnwindTable t = compile_unwind_table(path);
  EXPECT_GT(t.rows.size(), 100u) << path;
  elf_version(EV_CURRENT);
  const int fd = open(path.c_str(), O_RDONLY);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  Dwarf_CFI* cfi = dwarf_getcfi_elf(elf);
  Checked c;
  for (size_t i = 0; i + 1 < t.rows.size(); ++i) {
    const uint64_t lo = t.base + t.rows[i].pc, hi = t.base + t.rows[i + 1].pc;
    for (uint64_t a : {lo, lo + 1, hi - 1}) {
      if (a >= hi) continue;
      ++c.addresses;
      // Registers with distinct values; rip is the address, as the walker sees it.
      uint64_t regs[17];
      for (int r = 0; r < 17; ++r) regs[r] = 0x7ff000000000ULL + uint64_t(r) * 0x1000;
      regs[16] = a;
      UnwindRegs mine{a, regs[7], regs[6]};
      const auto res = unwind_step(t, a, mine, [](uint64_t addr, uint64_t& v) {
        v = fake_word(addr);
        return true;
      });

      Dwarf_Frame* frame = nullptr;
      if (dwarf_cfi_addrframe(cfi, a, &frame) != 0) {
        EXPECT_EQ(res, StepResult::NoRow) << path << " at " << std::hex << a;
        if (res == StepResult::NoRow) ++c.agreed;
        continue;
      }
      Dwarf_Op* ops;
      size_t n;
      Dwarf_Op mem[3];
      dwarf_frame_cfa(frame, &ops, &n);
      const auto cfa = eval(ops, n, regs, std::nullopt);
      // The walker knows rsp, rbp and rip only (rbx-based frames: _dl_runtime_resolve).
      bool other_register = false;
      for (size_t k = 0; k < n; ++k) {
        const int reg = ops[k].atom == DW_OP_bregx                                     ? int(ops[k].number)
                        : ops[k].atom >= DW_OP_breg0 && ops[k].atom <= DW_OP_breg31 ? ops[k].atom - DW_OP_breg0
                                                                                      : 6;
        other_register |= reg != 6 && reg != 7 && reg != 16;
      }
      std::optional<uint64_t> ra_addr, bp_addr;
      bool ra_undefined = false, bp_same = false;
      if (dwarf_frame_register(frame, 16, mem, &ops, &n) == 0) {
        ra_undefined = n == 0 && ops == mem;
        if (n && cfa && ops[n - 1].atom != DW_OP_stack_value) ra_addr = eval(ops, n, regs, cfa);
      }
      if (dwarf_frame_register(frame, 6, mem, &ops, &n) == 0) {
        bp_same = n == 0 && ops == nullptr;
        if (n && cfa && ops[n - 1].atom != DW_OP_stack_value) bp_addr = eval(ops, n, regs, cfa);
      }
      free(frame);

      if (ra_undefined) {
        EXPECT_EQ(res, StepResult::End) << path << " at " << std::hex << a;
        if (res == StepResult::End) ++c.agreed;
        continue;
      }
      if (!cfa || !ra_addr || *ra_addr != *cfa - 8) {
        // Rules the walker does not follow: it must stop rather than guess.
        EXPECT_NE(res, StepResult::Ok) << path << " at " << std::hex << a;
        if (res != StepResult::Ok) ++c.both_unsupported;
        continue;
      }
      if (res != StepResult::Ok) {
        // The walker may refuse what libdw follows only where the rules need a register it lacks.
        EXPECT_TRUE(other_register || (!bp_same && !bp_addr))
            << path << " at " << std::hex << a << ": walker refused a rule libdw follows";
        ++c.both_unsupported;
        continue;
      }
      EXPECT_EQ(mine.sp, *cfa) << path << " at " << std::hex << a;
      EXPECT_EQ(mine.ip, fake_word(*ra_addr)) << path << " at " << std::hex << a;
      if (bp_same) EXPECT_EQ(mine.bp, regs[6]) << path << " at " << std::hex << a;
      if (bp_addr) EXPECT_EQ(mine.bp, fake_word(*bp_addr)) << path << " at " << std::hex << a;
      if (mine.sp == *cfa && mine.ip == fake_word(*ra_addr)) ++c.agreed;
    }
  }
  dwarf_cfi_end(cfi);
  elf_end(elf);
  close(fd);
  return c;
}

}  // namespace

TEST(UnwindTable, RowsAgreeWithLibdwAtEveryRowOfTheCLibrary) {
  const auto c = check_against_libdw("/usr/lib/x86_64-linux-gnu/libc.so.6");
  EXPECT_GT(c.addresses, 50000u);
  // Nearly every address is followed; the rest are signal frames and hand-written code.
  EXPECT_GT(c.agreed, c.addresses * 99 / 100) << c.agreed << " of " << c.addresses;
}

TEST(UnwindTable, RowsAgreeWithLibdwInTheCudaRuntimeAndTheDynamicLoader) {
  for (const char* path : {"/usr/local/cuda/lib64/libcudart.so.13", "/lib64/ld-linux-x86-64.so.2"}) {
    if (access(path, R_OK) != 0) continue;
    const auto c = check_against_libdw(path);
    EXPECT_GT(c.agreed, c.addresses * 98 / 100) << path << ": " << c.agreed << " of " << c.addresses;
  }
}

TEST(UnwindTable, PltEntriesGetTheirExpression) {
  // Every PLT stub shares one FDE whose CFA is an expression of rip: it must become a PLT row.
  const UnwindTable t = compile_unwind_table("/usr/local/cuda/lib64/libcudart.so.13");
  size_t plt = 0;
  for (const auto& r : t.rows) plt += cfa_rule(r) == GS_CFA_PLT;
  EXPECT_GE(plt, 1u);
}

namespace {

// The row a plain binary search over the whole table finds (what the page index must agree with).
const gs_unwind_row* find_without_index(const UnwindTable& t, uint32_t pc) {
  auto it = std::upper_bound(t.rows.begin(), t.rows.end(), pc,
                             [](uint32_t v, const gs_unwind_row& r) { return v < r.pc; });
  return it == t.rows.begin() ? nullptr : &*(it - 1);
}

void expect_index_agrees(const UnwindTable& t, uint32_t pc) {
  const auto [lo, hi] = index_range(t, pc);
  ASSERT_LE(lo, hi);
  ASSERT_LE(hi, t.rows.size());
  const gs_unwind_row* want = find_without_index(t, pc);
  // The searched range holds the answer: no row before lo is above pc, none from hi on is below.
  if (lo > 0) EXPECT_LE(t.rows[lo - 1].pc, pc) << std::hex << pc;
  if (hi < t.rows.size()) EXPECT_GT(t.rows[hi].pc, pc) << std::hex << pc;
  auto it = std::upper_bound(t.rows.begin() + lo, t.rows.begin() + hi, pc,
                             [](uint32_t v, const gs_unwind_row& r) { return v < r.pc; });
  const gs_unwind_row* got = it == t.rows.begin() ? nullptr : &*(it - 1);
  EXPECT_EQ(got, want) << std::hex << pc;
}

}  // namespace

TEST(UnwindTable, PageIndexNarrowsTheSearchToTheRightRows) {
  const UnwindTable t = compile_unwind_table("/usr/lib/x86_64-linux-gnu/libc.so.6");
  ASSERT_GT(t.rows.size(), 1000u);
  ASSERT_GE(t.index.size(), 2u);
  EXPECT_EQ(t.index.back(), t.rows.size());
  // About kIndexRowsPerBucket rows a bucket: the index is small and the search short.
  EXPECT_LE(t.index.size() - 1, t.rows.size() / kIndexRowsPerBucket + 1);
  EXPECT_GE(t.index.size() - 1, t.rows.size() / kIndexRowsPerBucket / 2);
  for (const auto& r : t.rows)
    for (uint32_t pc : {r.pc, r.pc + 1, r.pc ? r.pc - 1 : 0u}) expect_index_agrees(t, pc);
  for (uint32_t pc : {0u, t.rows.back().pc + 1, t.rows.back().pc + 100000, UINT32_MAX}) expect_index_agrees(t, pc);
}

TEST(UnwindTable, PageIndexOfSmallAndSparseTables) {
  for (std::vector<uint32_t> pcs : std::vector<std::vector<uint32_t>>{
           {0}, {0, 16}, {0, 1, 2, 3, 4, 5, 6, 7, 8}, {0, 0x100, 0x7fffffff, 0xfffffff0}, {5, 0x40000, 0x40001}}) {
    UnwindTable t;
    for (uint32_t pc : pcs) t.rows.push_back(gs_unwind_row{pc, GS_CFA_RSP, 0, 1});
    build_index(t);
    ASSERT_GE(t.index.size(), 2u);
    EXPECT_EQ(t.index.back(), t.rows.size());
    for (uint32_t p : pcs)
      for (uint32_t pc : {p, p + 1, p ? p - 1 : 0u, p + 0x1000}) expect_index_agrees(t, pc);
    expect_index_agrees(t, UINT32_MAX);
  }
}

TEST(UnwindTable, UnreadableFilesAreErrorsNotEmptyTables) {
  EXPECT_THROW(compile_unwind_table("/etc/hostname"), std::runtime_error);
  EXPECT_THROW(compile_unwind_table("/nonexistent/lib.so"), std::runtime_error);
}

// ---- a walk of this process's own stack ----
namespace {

struct Capture {
  uint64_t ip, sp, bp;
  std::vector<uint64_t> libgcc;  // _Unwind_Backtrace's pcs, from the capturing function
};

_Unwind_Reason_Code collect(_Unwind_Context* ctx, void* arg) {
  static_cast<std::vector<uint64_t>*>(arg)->push_back(_Unwind_GetIP(ctx));
  return _URC_NO_REASON;
}

struct Tables {
  std::map<std::string, UnwindTable> by_path;
  std::vector<gpuscope::discover::Mapping> maps = gpuscope::discover::read_maps(getpid());
  // The table and file vaddr of an address of this process.
  std::pair<const UnwindTable*, uint64_t> find(uint64_t addr) {
    for (const auto& m : maps) {
      if (!m.executable || m.path.empty() || m.path[0] != '/' || addr < m.start || addr >= m.end) continue;
      auto it = by_path.find(m.path);
      if (it == by_path.end()) it = by_path.emplace(m.path, compile_unwind_table(m.path)).first;
      const auto vaddr = it->second.offset_to_vaddr(addr - m.start + m.offset);
      if (vaddr) return {&it->second, *vaddr};
    }
    return {nullptr, 0};
  }
};

// Walks the stack from `c` with the tables, reading this thread's live stack.
std::vector<uint64_t> walk(const Capture& c, Tables& tables, StepResult& last) {
  std::vector<uint64_t> ips;
  UnwindRegs r{c.ip, c.sp, c.bp};
  for (int depth = 0; depth < 128; ++depth) {
    ips.push_back(r.ip);
    auto [t, vaddr] = tables.find(r.ip);
    if (!t) {
      last = StepResult::NoRow;
      return ips;
    }
    last = unwind_step(*t, depth ? vaddr - 1 : vaddr, r, [&](uint64_t addr, uint64_t& v) {
      if (addr < c.sp || addr % 8) return false;  // only the callers' frames, live above us
      std::memcpy(&v, reinterpret_cast<const void*>(addr), 8);
      return true;
    });
    if (last != StepResult::Ok) return ips;
  }
  return ips;
}

struct Walked {
  Capture c;
  std::vector<uint64_t> ips;
  StepResult last = StepResult::Ok;
};

// Captures its registers, asks libgcc, and walks with the tables, all before it returns: the
// walk reads the callers' frames above this one's, which stay intact until then.
__attribute__((noinline)) void capture_and_walk(Walked& w, Tables& tables) {
  uint64_t ip, sp, bp;
  asm volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip), "=r"(sp), "=r"(bp));
  w.c = {ip, sp, bp, {}};
  _Unwind_Backtrace(collect, &w.c.libgcc);
  w.ips = walk(w.c, tables, w.last);
}

__attribute__((noinline)) int nested(int depth, Walked& w, Tables& tables) {
  volatile char pad[40 + depth * 8];  // frames of differing sizes
  pad[0] = char(depth);
  if (depth == 0) {
    capture_and_walk(w, tables);
    return pad[0];
  }
  const int r = nested(depth - 1, w, tables) + pad[0];
  asm volatile("" ::: "memory");  // not a tail call: this frame stays on the stack
  return r;
}

}  // namespace

TEST(UnwindTable, WalkOfOwnStackMatchesLibgcc) {
  Walked w;
  Tables tables;
  tables.find(reinterpret_cast<uint64_t>(&nested));  // compiled before the capture, not during the walk
  nested(6, w, tables);
  ASSERT_GE(w.c.libgcc.size(), 9u);
  EXPECT_EQ(w.last, StepResult::End) << "the walk must end where the CFI says the stack ends (_start)";
  // libgcc starts at capture_and_walk's pc after its call, the walk at the asm: their callers agree.
  ASSERT_GE(w.ips.size(), 2u);
  const std::vector<uint64_t> ours(w.ips.begin() + 1, w.ips.end());
  std::vector<uint64_t> theirs(w.c.libgcc.begin() + 1, w.c.libgcc.end());
  if (!theirs.empty() && theirs.back() == 0) theirs.pop_back();  // libgcc's frame past _start
  EXPECT_EQ(ours, theirs);
}

TEST(UnwindTable, CompiledTablesAreCachedByBuildIdAndACorruptCacheIsCompiledAgain) {
  namespace fs = std::filesystem;
  const std::string libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
  const fs::path dir = fs::temp_directory_path() / ("gpuscope-unwind-cache-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const auto same = [](const UnwindTable& a, const UnwindTable& b) {
    return a.base == b.base && a.index_shift == b.index_shift && a.rows.size() == b.rows.size() &&
           std::memcmp(a.rows.data(), b.rows.data(), a.rows.size() * sizeof(gs_unwind_row)) == 0 && a.index == b.index &&
           a.segments.size() == b.segments.size() && a.stats.fdes == b.stats.fdes && a.stats.source == b.stats.source;
  };
  const UnwindTable compiled = compile_unwind_table(libc);
  const CachedTable first = load_unwind_table(libc, dir);
  EXPECT_FALSE(first.from_cache);
  EXPECT_TRUE(same(first.table, compiled));
  ASSERT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
  const fs::path file = fs::directory_iterator(dir)->path();
  const CachedTable again = load_unwind_table(libc, dir);
  EXPECT_TRUE(again.from_cache);
  EXPECT_TRUE(same(again.table, compiled));
  // Cut short (a disk that filled up, a crash): compiled again, and the file replaced.
  fs::resize_file(file, fs::file_size(file) / 2);
  const CachedTable repaired = load_unwind_table(libc, dir);
  EXPECT_FALSE(repaired.from_cache);
  EXPECT_TRUE(same(repaired.table, compiled));
  EXPECT_TRUE(load_unwind_table(libc, dir).from_cache);
  // No cache: compiled every time; an unwritable cache directory likewise.
  EXPECT_FALSE(load_unwind_table(libc, "").from_cache);
  EXPECT_TRUE(same(load_unwind_table(libc, "/proc/gpuscope-no-such-dir").table, compiled));
  fs::remove_all(dir);
}
