// Compiles one ELF file's call frame information (.eh_frame, else .debug_frame) into the compact
// rows that the BPF stack walker searches (bpf/events.h: gs_unwind_row): for each address range
// with the same rules, how to find the CFA (rsp + n, rbp + n, a PLT entry's expression, ...) and
// where the caller's rbp was saved. The return address is always at CFA - 8 on x86-64; rules
// for it elsewhere mark the row unsupported.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "events.h"

namespace gpuscope::symbolize {

struct UnwindTable {
  uint64_t base = 0;                // the file vaddr that rows' pc are relative to
  std::vector<gs_unwind_row> rows;  // sorted by pc; each holds up to the next (the last is NONE)
  // The page index the BPF walker narrows its search with (bpf/events.h: gs_unwind_mapping):
  // index[k] counts the rows whose pc is below k << index_shift; the last entry is rows.size().
  std::vector<uint32_t> index;
  uint32_t index_shift = 0;
  // Where the file's executable PT_LOAD segments are: a mapping's file offset gives its vaddr.
  struct Segment {
    uint64_t offset, vaddr, filesz;
  };
  std::vector<Segment> segments;

  struct Stats {
    size_t fdes = 0;
    size_t ranges = 0;            // libdw frame states visited (before merging equal neighbours)
    size_t unsupported_cfa = 0;   // ranges whose CFA rule the walker does not know
    size_t unsupported_rbp = 0;   // ... whose rbp rule it does not know
    size_t unsupported_ra = 0;    // ... whose return address is not at CFA - 8
    std::string source;           // ".eh_frame", ".debug_frame" or "" (no CFI)
  } stats;

  // The row that applies to a file vaddr, or nullopt outside every FDE.
  const gs_unwind_row* find(uint64_t vaddr) const;
  // The file vaddr of a file offset in an executable segment.
  std::optional<uint64_t> offset_to_vaddr(uint64_t offset) const;
  // Row slots the rows and their index take in the BPF array (two index entries a slot).
  size_t slots() const { return rows.size() + (index.size() + 1) / 2; }
  size_t bytes() const { return slots() * sizeof(gs_unwind_row); }
};

// Fills t.index for t.rows: buckets of 2^shift bytes of pc, the shift chosen so that there is
// about one bucket for every kIndexRowsPerBucket rows or fewer (the index costs at most 1/8 of
// the rows' memory).
inline constexpr uint32_t kIndexRowsPerBucket = 4;
void build_index(UnwindTable& t);
// The range [lo, hi) of rows that holds the last row at or below pc (relative to t.base): the
// search the BPF walker does (bpf/unwind_ehframe.bpf.c: unwind_frame), before its binary search.
std::pair<uint32_t, uint32_t> index_range(const UnwindTable& t, uint32_t pc);

// Throws Error naming the path and the reason when the file cannot be read or its frame
// information spans more than 4 GiB (rows keep 32-bit pcs), or when *cancel is set while it
// runs. A file without CFI gives no rows.
UnwindTable compile_unwind_table(const std::string& path, const std::atomic<bool>* cancel = nullptr);

// compile_unwind_table through a cache of compiled tables in `cache_dir`, by build id and size
// (a PyTorch process's ~80 libraries take ~10 s to compile; read back, well under a second).
// Files without a build id, an empty cache_dir, or a cache that cannot be read or written:
// compiled as if there were none. A cache file that does not read back whole is compiled
// again and replaced. The cache is kept under kUnwindCacheBytes, the oldest files going first.
inline constexpr uint64_t kUnwindCacheBytes = 1ull << 30;
struct CachedTable {
  UnwindTable table;
  bool from_cache = false;
};
CachedTable load_unwind_table(const std::string& path, const std::string& cache_dir,
                              const std::atomic<bool>* cancel = nullptr);
// The file's table if the cache has it (read back, never compiled); nullopt otherwise.
std::optional<UnwindTable> load_cached_unwind_table(const std::string& path, const std::string& cache_dir);

inline uint8_t cfa_rule(const gs_unwind_row& r) { return r.rules & 0xf; }
inline uint8_t rbp_rule(const gs_unwind_row& r) { return r.rules >> 4; }

// One step of the walk the BPF side does (bpf/unwind_ehframe.bpf.c: unwind_frame), over a table in
// user space: the unit tests check it against libgcc's and libdw's unwinders.
struct UnwindRegs {
  uint64_t ip = 0, sp = 0, bp = 0;
  bool bp_known = true;
};
enum class StepResult { Ok, End, NoRow, Unsupported, ReadFault };
// `vaddr`: the file vaddr of regs.ip (minus 1 for a return address); `read` reads 8 bytes of
// the stack, false where it cannot.
template <class Read>
StepResult unwind_step(const UnwindTable& t, uint64_t vaddr, UnwindRegs& regs, Read&& read) {
  const gs_unwind_row* row = t.find(vaddr);
  if (!row || cfa_rule(*row) == GS_CFA_NONE) return StepResult::NoRow;
  uint64_t cfa = 0;
  switch (cfa_rule(*row)) {
    case GS_CFA_OUTERMOST: return StepResult::End;
    case GS_CFA_RSP: cfa = regs.sp + int64_t(row->cfa_off) * 8; break;
    case GS_CFA_RBP:
      if (!regs.bp_known) return StepResult::Unsupported;
      cfa = regs.bp + int64_t(row->cfa_off) * 8;
      break;
    case GS_CFA_PLT: cfa = regs.sp + 8 + ((regs.ip & 15) >= uint64_t(row->cfa_off) ? 8 : 0); break;
    case GS_CFA_DEREF_RBP:
      if (!regs.bp_known || !read(regs.bp + int64_t(row->cfa_off) * 8, cfa)) return StepResult::ReadFault;
      break;
    default: return StepResult::Unsupported;
  }
  uint64_t ra = 0, bp = regs.bp;
  if (!read(cfa - 8, ra)) return StepResult::ReadFault;
  bool bp_known = regs.bp_known;
  switch (rbp_rule(*row)) {
    case GS_RBP_SAME: break;
    case GS_RBP_AT_CFA:
      if (!read(cfa + int64_t(row->rbp_off) * 8, bp)) return StepResult::ReadFault;
      bp_known = true;
      break;
    case GS_RBP_AT_RBP:
      if (!regs.bp_known || !read(regs.bp + int64_t(row->rbp_off) * 8, bp)) return StepResult::ReadFault;
      break;
    default: bp_known = false;
  }
  regs = {ra, cfa, bp, bp_known};
  return ra == 0 ? StepResult::End : StepResult::Ok;
}

}  // namespace gpuscope::symbolize
