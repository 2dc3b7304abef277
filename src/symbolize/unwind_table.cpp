#include "symbolize/unwind_table.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>
#include <fstream>
#include <map>
#include <memory>

#include "common/error.h"
#include "elf/elf_file.h"

namespace gpuscope::symbolize {
namespace {

constexpr int kRegRbp = 6, kRegRsp = 7, kRegRip = 16;

struct Closer {
  int fd;
  ~Closer() {
    if (fd >= 0) close(fd);
  }
};

// --- FDE address ranges ---
// libdw finds the frame state at an address (dwarf_cfi_addrframe) but hands out FDEs only as
// raw bytes (dwarf_next_cfi): their ranges are decoded here, with the pointer encoding their
// CIE's augmentation names (DW_EH_PE_*, LSB "Exception Frames").

size_t uleb_skip(const uint8_t* p, const uint8_t* end) {
  size_t n = 0;
  while (p + n < end && (p[n] & 0x80)) ++n;
  return n + 1;
}

uint64_t read_uleb(const uint8_t*& p, const uint8_t* end) {
  uint64_t v = 0;
  for (int shift = 0; p < end; shift += 7) {
    const uint8_t b = *p++;
    if (shift < 64) v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
  }
  return v;
}

int64_t read_sleb(const uint8_t*& p, const uint8_t* end) {
  int64_t v = 0;
  int shift = 0;
  uint8_t b = 0;
  do {
    if (p >= end) return v;
    b = *p++;
    if (shift < 64) v |= int64_t(b & 0x7f) << shift;
    shift += 7;
  } while (b & 0x80);
  if (shift < 64 && (b & 0x40)) v |= -(int64_t(1) << shift);
  return v;
}

// Reads one encoded pointer at p (advancing it); `field_vaddr` is p's address in the file, for
// pc-relative encodings. False for encodings FDEs do not use.
bool read_encoded(uint8_t enc, const uint8_t*& p, const uint8_t* end, uint64_t field_vaddr, bool apply,
                  uint64_t& out) {
  auto fixed = [&](auto v) {
    if (p + sizeof(v) > end) return false;
    std::memcpy(&v, p, sizeof(v));
    p += sizeof(v);
    out = uint64_t(int64_t(v));
    return true;
  };
  bool ok = false;
  switch (enc & 0x0f) {
    case DW_EH_PE_absptr: ok = fixed(uint64_t{}); break;
    case DW_EH_PE_uleb128: out = read_uleb(p, end); ok = true; break;
    case DW_EH_PE_udata2: { uint16_t v; ok = p + 2 <= end; if (ok) { std::memcpy(&v, p, 2); p += 2; out = v; } break; }
    case DW_EH_PE_udata4: { uint32_t v; ok = p + 4 <= end; if (ok) { std::memcpy(&v, p, 4); p += 4; out = v; } break; }
    case DW_EH_PE_udata8: ok = fixed(uint64_t{}); break;
    case DW_EH_PE_sleb128: out = uint64_t(read_sleb(p, end)); ok = true; break;
    case DW_EH_PE_sdata2: ok = fixed(int16_t{}); break;
    case DW_EH_PE_sdata4: ok = fixed(int32_t{}); break;
    case DW_EH_PE_sdata8: ok = fixed(int64_t{}); break;
    default: return false;
  }
  if (!ok) return false;
  if (!apply) return true;
  switch (enc & 0x70) {
    case DW_EH_PE_absptr: return true;
    case DW_EH_PE_pcrel: out += field_vaddr; return true;
    default: return false;  // datarel, textrel, funcrel: not seen in FDEs on x86-64
  }
}

size_t encoded_size(uint8_t enc, const uint8_t* p, const uint8_t* end) {
  switch (enc & 0x0f) {
    case DW_EH_PE_absptr: case DW_EH_PE_udata8: case DW_EH_PE_sdata8: return 8;
    case DW_EH_PE_udata2: case DW_EH_PE_sdata2: return 2;
    case DW_EH_PE_udata4: case DW_EH_PE_sdata4: return 4;
    default: return uleb_skip(p, end);
  }
}

// The encoding of a CIE's FDEs' pointers ('R' of a "z..." augmentation); nullopt for an
// augmentation that cannot be read.
std::optional<uint8_t> fde_encoding(const Dwarf_CIE& cie, bool eh_frame) {
  if (!eh_frame) return DW_EH_PE_absptr;
  const char* aug = cie.augmentation;
  if (!aug || !*aug) return DW_EH_PE_absptr;
  if (aug[0] != 'z') return std::nullopt;
  const uint8_t* p = cie.augmentation_data;
  const uint8_t* end = p + cie.augmentation_data_size;
  uint8_t enc = DW_EH_PE_absptr;
  for (const char* a = aug + 1; *a && p < end; ++a) {
    switch (*a) {
      case 'P': {
        const uint8_t penc = *p++;
        p += encoded_size(penc, p, end);
        break;
      }
      case 'L': ++p; break;
      case 'R': enc = *p++; break;
      case 'S': case 'B': break;
      default: return std::nullopt;
    }
  }
  return enc;
}

// Do a CIE's or FDE's instructions name only registers x86-64 has (DWARF numbers up to 130:
// the general registers, rip, the vector, x87, mask and segment registers)? libdw sizes each
// frame state it builds for the highest register named and copies it at every row and
// remember_state: a crafted FDE naming register 2^20 made each of its rows cost megabytes of
// memset (a 35 KB file took 51 s to compile). False too for instructions that cannot be read.
constexpr uint64_t kMaxCfiRegister = 130;
bool cfi_registers_bounded(const uint8_t* p, const uint8_t* end, uint8_t pointer_encoding) {
  auto reg_ok = [&] { return read_uleb(p, end) <= kMaxCfiRegister; };
  auto skip_block = [&] {
    const uint64_t n = read_uleb(p, end);
    if (n > uint64_t(end - p)) return false;
    p += n;
    return true;
  };
  while (p < end) {
    const uint8_t op = *p++;
    switch (op >> 6) {
      case 1: continue;                                      // advance_loc
      case 2: (void)read_uleb(p, end); continue;             // offset(reg): reg < 64, then the offset
      case 3: continue;                                      // restore(reg): reg < 64
      default: break;
    }
    switch (op) {
      case DW_CFA_nop: case DW_CFA_remember_state: case DW_CFA_restore_state: break;
      case DW_CFA_set_loc: p += std::min<size_t>(encoded_size(pointer_encoding, p, end), size_t(end - p)); break;
      case DW_CFA_advance_loc1: p += std::min<ptrdiff_t>(1, end - p); break;
      case DW_CFA_advance_loc2: p += std::min<ptrdiff_t>(2, end - p); break;
      case DW_CFA_advance_loc4: p += std::min<ptrdiff_t>(4, end - p); break;
      case DW_CFA_def_cfa_offset: case DW_CFA_GNU_args_size: (void)read_uleb(p, end); break;
      case DW_CFA_def_cfa_offset_sf: (void)read_sleb(p, end); break;
      case DW_CFA_restore_extended: case DW_CFA_undefined: case DW_CFA_same_value: case DW_CFA_def_cfa_register:
        if (!reg_ok()) return false;
        break;
      case DW_CFA_register:
        if (!reg_ok() || !reg_ok()) return false;
        break;
      case DW_CFA_offset_extended: case DW_CFA_def_cfa: case DW_CFA_val_offset:
      case DW_CFA_GNU_negative_offset_extended:
        if (!reg_ok()) return false;
        (void)read_uleb(p, end);
        break;
      case DW_CFA_offset_extended_sf: case DW_CFA_def_cfa_sf: case DW_CFA_val_offset_sf:
        if (!reg_ok()) return false;
        (void)read_sleb(p, end);
        break;
      case DW_CFA_def_cfa_expression:
        if (!skip_block()) return false;
        break;
      case DW_CFA_expression: case DW_CFA_val_expression:
        if (!reg_ok() || !skip_block()) return false;
        break;
      default: return false;  // an operation libdw would not run either
    }
  }
  return true;
}

uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

struct FdeRange {
  uint64_t lo, hi;
};

struct FdeScan {
  std::vector<FdeRange> ranges;
  std::set<Dwarf_Off> offsets;  // of the FDEs whose instructions were checked and passed
  bool unsafe = false;          // a CIE or FDE names a register x86-64 lacks, or an unknown operation
};

FdeScan fde_ranges(Elf* elf, Elf_Data* data, uint64_t section_vaddr, bool eh_frame) {
  FdeScan scan;
  const unsigned char* ident = reinterpret_cast<const unsigned char*>(elf_getident(elf, nullptr));
  struct Cie {
    std::optional<uint8_t> encoding;  // nullopt: its FDEs cannot be read
    bool augmented = false;           // 'z': FDEs have augmentation data before their instructions
  };
  std::map<Dwarf_Off, Cie> cies;
  struct Raw {
    Dwarf_Off off, cie;
    const uint8_t* start;
    const uint8_t* end;
  };
  std::vector<Raw> fdes;
  for (Dwarf_Off off = 0, next = 0;; off = next) {
    Dwarf_CFI_Entry e;
    const int rc = dwarf_next_cfi(ident, data, eh_frame, off, &next, &e);
    if (rc != 0) break;  // 1: the end; -1: a corrupt entry, and nothing after it can be found
    if (dwarf_cfi_cie_p(&e)) {
      Cie& c = cies[off];
      c.encoding = fde_encoding(e.cie, eh_frame);
      c.augmented = eh_frame && e.cie.augmentation && e.cie.augmentation[0] == 'z';
      // The return address's register, too, sizes libdw's frame states.
      if (c.encoding && (e.cie.return_address_register > kMaxCfiRegister ||
                         !cfi_registers_bounded(e.cie.initial_instructions, e.cie.initial_instructions_end, *c.encoding))) {
        c.encoding.reset();
        scan.unsafe = true;
      }
    } else {
      fdes.push_back({off, e.fde.CIE_pointer, e.fde.start, e.fde.end});
    }
  }
  auto& out = scan.ranges;
  out.reserve(fdes.size());
  const auto* base = static_cast<const uint8_t*>(data->d_buf);
  for (const auto& f : fdes) {
    auto cie = cies.find(f.cie);
    if (cie == cies.end() || !cie->second.encoding) continue;
    const uint8_t enc = *cie->second.encoding;
    const uint8_t* p = f.start;
    uint64_t lo = 0, len = 0;
    if (!read_encoded(enc, p, f.end, section_vaddr + uint64_t(p - base), true, lo)) continue;
    if (!read_encoded(enc & 0x0f, p, f.end, 0, false, len)) continue;
    if (len == 0 || lo == 0) continue;  // discarded functions' FDEs point at 0
    if (cie->second.augmented) {
      const uint64_t n = read_uleb(p, f.end);
      if (n > uint64_t(f.end - p)) continue;
      p += n;
    }
    if (!cfi_registers_bounded(p, f.end, enc)) {
      scan.unsafe = true;
      continue;
    }
    scan.offsets.insert(f.off);
    out.push_back({lo, lo + len});
  }
  return scan;
}

// libdw finds an address's FDE through .eh_frame_hdr's sorted table when the file has one: each
// entry must name an FDE checked by fde_ranges, or libdw would run instructions nobody checked
// (a crafted table pointing at an FDE that names register 2^28: a second of memset per row).
// The table's entries are offsets from the header (datarel, sdata4), as every x86-64 linker
// writes them; another encoding is refused too.
Elf_Scn* section_named(Elf* elf, const char* name, GElf_Shdr& shdr);

bool header_table_checked(Elf* elf, uint64_t eh_frame_vaddr, const std::set<Dwarf_Off>& fdes) {
  GElf_Shdr shdr{};
  Elf_Scn* scn = section_named(elf, ".eh_frame_hdr", shdr);
  if (!scn) return true;  // libdw searches the FDEs themselves
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (!data || !data->d_buf || data->d_size < 4) return false;
  const auto* p = static_cast<const uint8_t*>(data->d_buf);
  const uint8_t* end = p + data->d_size;
  const uint8_t version = p[0], ptr_enc = p[1], count_enc = p[2], table_enc = p[3];
  if (version != 1) return false;
  if (table_enc == DW_EH_PE_omit) return true;
  if (table_enc != (DW_EH_PE_datarel | DW_EH_PE_sdata4)) return false;
  const uint8_t* at = p + 4;
  uint64_t eh_frame_ptr = 0, count = 0;
  if (!read_encoded(ptr_enc & 0x0f, at, end, 0, false, eh_frame_ptr)) return false;
  if (!read_encoded(count_enc & 0x0f, at, end, 0, false, count)) return false;
  if (count > uint64_t(end - at) / 8) return false;
  for (uint64_t i = 0; i < count; ++i, at += 8) {
    int32_t fde_rel;
    std::memcpy(&fde_rel, at + 4, 4);
    const uint64_t fde_vaddr = shdr.sh_addr + uint64_t(int64_t(fde_rel));
    if (fde_vaddr < eh_frame_vaddr || !fdes.contains(fde_vaddr - eh_frame_vaddr)) return false;
  }
  return true;
}

// --- rules ---

// A register saved at CFA + k (the form libdw gives the offset(N) rule).
bool at_cfa(const Dwarf_Op* ops, size_t nops, int64_t& k) {
  if (nops == 0 || ops[0].atom != DW_OP_call_frame_cfa) return false;
  if (nops == 1) {
    k = 0;
    return true;
  }
  if (nops == 2 && ops[1].atom == DW_OP_plus_uconst) {
    k = int64_t(ops[1].number);
    return true;
  }
  return false;
}

bool words(int64_t bytes, int64_t lo, int64_t hi, int64_t& out) {
  if (bytes % 8) return false;
  out = bytes / 8;
  return out >= lo && out <= hi;
}

// (register, offset) of a "register + offset" expression.
bool reg_plus(const Dwarf_Op& op, int& reg, int64_t& off) {
  if (op.atom == DW_OP_bregx) {
    reg = int(op.number);
    off = int64_t(op.number2);
    return true;
  }
  if (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg31) {
    reg = op.atom - DW_OP_breg0;
    off = int64_t(op.number);
    return true;
  }
  return false;
}

// The x86-64 PLT entries' CFA: rsp + 8, and 8 more once the entry has pushed its index.
bool plt_expression(const Dwarf_Op* ops, size_t nops, int& threshold) {
  int reg;
  int64_t off;
  if (nops != 9 || !reg_plus(ops[0], reg, off) || reg != kRegRsp || off != 8) return false;
  if (!reg_plus(ops[1], reg, off) || reg != kRegRip || off != 0) return false;
  if (ops[2].atom != DW_OP_lit15 || ops[3].atom != DW_OP_and || ops[4].atom < DW_OP_lit0 ||
      ops[4].atom > DW_OP_lit15 || ops[5].atom != DW_OP_ge || ops[6].atom != DW_OP_lit3 || ops[7].atom != DW_OP_shl ||
      ops[8].atom != DW_OP_plus)
    return false;
  threshold = ops[4].atom - DW_OP_lit0;
  return true;
}

gs_unwind_row classify(Dwarf_Frame* frame, UnwindTable::Stats& st) {
  gs_unwind_row row{};
  auto set = [&](uint8_t cfa, uint8_t rbp) { row.rules = uint8_t(cfa | (rbp << 4)); };
  Dwarf_Addr start, end;
  bool signal = false;
  const int ra_reg = dwarf_frame_info(frame, &start, &end, &signal);
  Dwarf_Op mem[3];
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  // The return address: undefined in the outermost frame (_start, clone); else at CFA - 8.
  if (ra_reg != kRegRip || dwarf_frame_register(frame, ra_reg, mem, &ops, &nops) != 0) {
    ++st.unsupported_ra;
    set(GS_CFA_UNSUPPORTED, GS_RBP_UNKNOWN);
    return row;
  }
  if (nops == 0 && ops == mem) {
    set(GS_CFA_OUTERMOST, GS_RBP_UNKNOWN);
    return row;
  }
  int64_t k = 0;
  // A signal frame's "return address" is the interrupted pc, saved elsewhere: not walked.
  if (signal || !at_cfa(ops, nops, k) || k != -8) {
    ++st.unsupported_ra;
    set(GS_CFA_UNSUPPORTED, GS_RBP_UNKNOWN);
    return row;
  }

  uint8_t rbp = GS_RBP_UNKNOWN;
  if (dwarf_frame_register(frame, kRegRbp, mem, &ops, &nops) == 0) {
    int reg;
    int64_t off, w;
    if (nops == 0 && ops == nullptr) {
      rbp = GS_RBP_SAME;
    } else if (nops == 0) {
      rbp = GS_RBP_UNKNOWN;  // undefined: clobbered
    } else if (at_cfa(ops, nops, k) && words(k, INT8_MIN, INT8_MAX, w)) {
      rbp = GS_RBP_AT_CFA;
      row.rbp_off = int8_t(w);
    } else if (nops == 2 && ops[0].atom == DW_OP_call_frame_cfa && reg_plus(ops[1], reg, off) && reg == kRegRbp &&
               words(off, INT8_MIN, INT8_MAX, w)) {
      // DW_CFA_expression (libdw puts the CFA first, as its evaluation starts with it): the
      // realigned frames' "saved at rbp + off".

      rbp = GS_RBP_AT_RBP;
      row.rbp_off = int8_t(w);
    } else {
      ++st.unsupported_rbp;
    }
  } else {
    ++st.unsupported_rbp;
  }

  uint8_t cfa = GS_CFA_UNSUPPORTED;
  if (dwarf_frame_cfa(frame, &ops, &nops) == 0) {
    int reg, threshold;
    int64_t off, w;
    if (nops == 1 && reg_plus(ops[0], reg, off) && (reg == kRegRsp || reg == kRegRbp) &&
        words(off, INT16_MIN, INT16_MAX, w)) {
      cfa = reg == kRegRsp ? GS_CFA_RSP : GS_CFA_RBP;
      row.cfa_off = int16_t(w);
    } else if (plt_expression(ops, nops, threshold)) {
      cfa = GS_CFA_PLT;
      row.cfa_off = int16_t(threshold);
    } else if (nops == 2 && reg_plus(ops[0], reg, off) && reg == kRegRbp && ops[1].atom == DW_OP_deref &&
               words(off, INT16_MIN, INT16_MAX, w)) {
      cfa = GS_CFA_DEREF_RBP;
      row.cfa_off = int16_t(w);
    }
  }
  if (cfa == GS_CFA_UNSUPPORTED) ++st.unsupported_cfa;
  set(cfa, rbp);
  return row;
}

bool same_rules(const gs_unwind_row& a, const gs_unwind_row& b) {
  return a.rules == b.rules && a.rbp_off == b.rbp_off && a.cfa_off == b.cfa_off;
}

Elf_Scn* section_named(Elf* elf, const char* name, GElf_Shdr& shdr) {
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return nullptr;
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn));) {
    if (!gelf_getshdr(scn, &shdr) || shdr.sh_type == SHT_NOBITS) continue;
    const char* n = elf_strptr(elf, shstrndx, shdr.sh_name);
    if (n && !std::strcmp(n, name)) return scn;
  }
  return nullptr;
}

}  // namespace

void build_index(UnwindTable& t) {
  t.index.clear();
  t.index_shift = 0;
  if (t.rows.empty()) return;
  const uint64_t span = uint64_t(t.rows.back().pc) + 1;
  const uint64_t want = std::max<uint64_t>(1, t.rows.size() / kIndexRowsPerBucket);
  uint32_t shift = 4;  // no bucket smaller than 16 bytes: a row per instruction at most
  while (shift < 32 && (span >> shift) >= want) ++shift;
  const uint64_t buckets = ((span - 1) >> shift) + 1;  // the last row's pc is in the last bucket
  t.index.resize(buckets + 1);
  size_t r = 0;
  for (uint64_t k = 0; k <= buckets; ++k) {
    while (r < t.rows.size() && uint64_t(t.rows[r].pc) < (k << shift)) ++r;
    t.index[k] = uint32_t(r);
  }
  t.index.back() = uint32_t(t.rows.size());
  t.index_shift = shift;
}

std::pair<uint32_t, uint32_t> index_range(const UnwindTable& t, uint32_t pc) {
  const auto n = uint32_t(t.rows.size());
  if (t.index.size() < 2) return {0, n};
  const uint64_t b = uint64_t(pc) >> t.index_shift;
  if (b >= t.index.size() - 1) return {n, n};  // past the last row's bucket: every row is below
  return {t.index[b], t.index[b + 1]};
}

const gs_unwind_row* UnwindTable::find(uint64_t vaddr) const {
  if (rows.empty() || vaddr < base || vaddr - base > UINT32_MAX) return nullptr;
  const uint32_t pc = uint32_t(vaddr - base);
  // As the BPF walker searches: within the index's range only.
  const auto [lo, hi] = index_range(*this, pc);
  auto it = std::upper_bound(rows.begin() + lo, rows.begin() + hi, pc,
                             [](uint32_t v, const gs_unwind_row& r) { return v < r.pc; });
  if (it == rows.begin()) return nullptr;
  --it;
  return cfa_rule(*it) == GS_CFA_NONE ? nullptr : &*it;
}

std::optional<uint64_t> UnwindTable::offset_to_vaddr(uint64_t offset) const {
  for (const auto& s : segments)
    if (offset >= s.offset && offset < s.offset + s.filesz) return offset - s.offset + s.vaddr;
  return std::nullopt;
}

UnwindTable compile_unwind_table(const std::string& path, const std::atomic<bool>* cancel) {
  elf_version(EV_CURRENT);
  Closer fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) throw Error("cannot open {}: {}", path, strerror(errno));
  std::unique_ptr<Elf, int (*)(Elf*)> elf(elf_begin(fd.fd, ELF_C_READ_MMAP, nullptr), elf_end);
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) throw Error("{} is not an ELF file", path);

  UnwindTable t;
  size_t nphdr = 0;
  elf_getphdrnum(elf.get(), &nphdr);
  for (size_t i = 0; i < nphdr; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf.get(), int(i), &ph)) break;  // past the table (a crafted count)
    if (ph.p_type == PT_LOAD) t.segments.push_back({ph.p_offset, ph.p_vaddr, ph.p_filesz});
  }

  GElf_Shdr shdr{};
  bool eh_frame = true;
  Elf_Scn* scn = section_named(elf.get(), ".eh_frame", shdr);
  Dwarf_CFI* cfi = nullptr;
  std::unique_ptr<Dwarf, int (*)(Dwarf*)> dwarf(nullptr, dwarf_end);
  std::unique_ptr<Dwarf_CFI, int (*)(Dwarf_CFI*)> eh_cfi(nullptr, dwarf_cfi_end);
  if (scn && shdr.sh_size > 0) {
    eh_cfi.reset(dwarf_getcfi_elf(elf.get()));
    cfi = eh_cfi.get();
  }
  if (!cfi) {
    eh_frame = false;
    scn = section_named(elf.get(), ".debug_frame", shdr);
    if (!scn) return t;  // no CFI: the walker uses frame pointers in this file
    dwarf.reset(dwarf_begin_elf(elf.get(), DWARF_C_READ, nullptr));
    if (dwarf) cfi = dwarf_getcfi(dwarf.get());
    if (!cfi) return t;
  }
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (!data || !data->d_buf) return t;
  t.stats.source = eh_frame ? ".eh_frame" : ".debug_frame";

  auto scan = fde_ranges(elf.get(), data, shdr.sh_addr, eh_frame);
  if (scan.unsafe)
    throw Error("{}: its frame information names registers x86-64 does not have, or operations unknown here", path);
  if (eh_frame && !header_table_checked(elf.get(), shdr.sh_addr, scan.offsets))
    throw Error("{}: its .eh_frame_hdr table names something other than the file's FDEs", path);
  const auto& ranges = scan.ranges;
  t.stats.fdes = ranges.size();
  // Each range's frame states, then a NONE row where it ends (a gap until the next FDE).
  struct At {
    uint64_t vaddr;
    gs_unwind_row row;
  };
  std::vector<At> at;
  at.reserve(ranges.size() * 6);
  // libdw runs an FDE's program from its start for each row asked for: rows^2 / 2 steps per FDE.
  // Real FDEs have tens of rows (574 at most in libLLVM, 322 in libcublasLt), a crafted one
  // thousands in a few kilobytes (a 35 KB file took 51 s). Bounded by the section's size, far
  // above what real files need (libLLVM's total is under a tenth of it).
  const uint64_t work_limit = 64 * uint64_t(shdr.sh_size) + 1'000'000;
  uint64_t work = 0;
  // And by this thread's CPU time: libdw finds an FDE through .eh_frame_hdr, whose table a
  // crafted file can point anywhere, past the FDEs checked above (a 35 KB file made each row
  // cost megabytes of memset that way: 50 s). Real files take well under a tenth of this
  // (libcublasLt's 171,047 FDEs: 0.4 s).
  const uint64_t cpu_limit_ns = 5'000'000'000 + 20'000'000 * (uint64_t(shdr.sh_size) >> 20);
  const uint64_t cpu_start_ns = thread_cpu_ns();
  for (const auto& r : ranges) {
    if (cancel && cancel->load(std::memory_order_relaxed)) throw Error("{}: compile cancelled", path);
    uint64_t rows_in_fde = 0;
    for (uint64_t a = r.lo; a < r.hi;) {
      work += ++rows_in_fde;
      if (work > work_limit)
        throw Error("{}: its frame information takes too long to compile (rows of one function re-run {} times)",
                    path, work);
      if ((work & 63) == 0 && thread_cpu_ns() - cpu_start_ns > cpu_limit_ns)
        throw Error("{}: its frame information takes too long to compile (over {:.1f} s of CPU)", path,
                    double(cpu_limit_ns) / 1e9);
      Dwarf_Frame* frame = nullptr;
      if (dwarf_cfi_addrframe(cfi, a, &frame) != 0) break;  // the rest of the FDE is unreadable: no info
      Dwarf_Addr start = 0, end = 0;
      dwarf_frame_info(frame, &start, &end, nullptr);
      at.push_back({a, classify(frame, t.stats)});
      ++t.stats.ranges;
      free(frame);
      a = std::max<uint64_t>(end, a + 1);
    }
    at.push_back({r.hi, gs_unwind_row{}});
  }
  // By address; where an FDE starts at the end of another, its row wins over the gap's.
  std::stable_sort(at.begin(), at.end(), [](const At& x, const At& y) {
    if (x.vaddr != y.vaddr) return x.vaddr < y.vaddr;
    return cfa_rule(x.row) == GS_CFA_NONE && cfa_rule(y.row) != GS_CFA_NONE;
  });
  if (at.empty()) return t;
  t.base = at.front().vaddr;
  if (at.back().vaddr - t.base > UINT32_MAX)
    throw Error("{}: frame information spans {:#x} bytes, more than unwind rows can address", path,
                at.back().vaddr - t.base);
  for (size_t i = 0; i < at.size(); ++i) {
    if (i + 1 < at.size() && at[i + 1].vaddr == at[i].vaddr) continue;  // the last one at an address wins
    gs_unwind_row row = at[i].row;
    if (!t.rows.empty() && same_rules(t.rows.back(), row)) continue;
    row.pc = uint32_t(at[i].vaddr - t.base);
    t.rows.push_back(row);
  }
  build_index(t);
  return t;
}

namespace {

// The cache file: a header, then the table's arrays as they are in memory. The magic's number
// is the format's and the compiler's version: change it whenever rows or their index would come
// out differently, and the tables of older gpuscopes are compiled again, not read.
constexpr char kCacheMagic[8] = {'G', 'S', 'U', 'T', 'A', 'B', '0', '1'};
struct CacheHeader {
  char magic[8];
  uint64_t base;
  uint32_t index_shift, rows, index, segments;
  uint64_t fdes, ranges, unsupported_cfa, unsupported_rbp, unsupported_ra;
  uint32_t source_len, pad;
};

template <class T>
bool read_array(std::istream& in, std::vector<T>& v, size_t n) {
  v.resize(n);
  return bool(in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(T))));
}

std::optional<UnwindTable> read_cached(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  CacheHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h)) || std::memcmp(h.magic, kCacheMagic, sizeof(kCacheMagic)) != 0)
    return std::nullopt;
  // Sizes a corrupt header could claim are bounded by what the file holds.
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(file, ec);
  const uint64_t want = sizeof(h) + uint64_t(h.source_len) + uint64_t(h.rows) * sizeof(gs_unwind_row) +
                        uint64_t(h.index) * sizeof(uint32_t) + uint64_t(h.segments) * sizeof(UnwindTable::Segment);
  if (ec || size != want) return std::nullopt;
  UnwindTable t;
  t.base = h.base;
  t.index_shift = h.index_shift;
  t.stats = {h.fdes, h.ranges, h.unsupported_cfa, h.unsupported_rbp, h.unsupported_ra, std::string(h.source_len, '\0')};
  if (!in.read(t.stats.source.data(), h.source_len) || !read_array(in, t.rows, h.rows) ||
      !read_array(in, t.index, h.index) || !read_array(in, t.segments, h.segments))
    return std::nullopt;
  // What the walker relies on: rows sorted by pc, an index that counts them.
  for (size_t i = 1; i < t.rows.size(); ++i)
    if (t.rows[i].pc < t.rows[i - 1].pc) return std::nullopt;
  for (size_t i = 1; i < t.index.size(); ++i)
    if (t.index[i] < t.index[i - 1]) return std::nullopt;
  if (!t.rows.empty() && (t.index.empty() || t.index.back() != t.rows.size())) return std::nullopt;
  return t;
}

void write_cached(const std::filesystem::path& file, const UnwindTable& t) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  CacheHeader h{};
  std::memcpy(h.magic, kCacheMagic, sizeof(kCacheMagic));
  h.base = t.base;
  h.index_shift = t.index_shift;
  h.rows = uint32_t(t.rows.size());
  h.index = uint32_t(t.index.size());
  h.segments = uint32_t(t.segments.size());
  h.fdes = t.stats.fdes;
  h.ranges = t.stats.ranges;
  h.unsupported_cfa = t.stats.unsupported_cfa;
  h.unsupported_rbp = t.stats.unsupported_rbp;
  h.unsupported_ra = t.stats.unsupported_ra;
  h.source_len = uint32_t(t.stats.source.size());
  // Written beside it, then renamed: a reader (another gpuscope) sees the whole file or none.
  fs::path tmp = file;
  tmp += ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    out.write(t.stats.source.data(), std::streamsize(t.stats.source.size()));
    out.write(reinterpret_cast<const char*>(t.rows.data()), std::streamsize(t.rows.size() * sizeof(gs_unwind_row)));
    out.write(reinterpret_cast<const char*>(t.index.data()), std::streamsize(t.index.size() * sizeof(uint32_t)));
    out.write(reinterpret_cast<const char*>(t.segments.data()),
              std::streamsize(t.segments.size() * sizeof(UnwindTable::Segment)));
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
  // Bounded: the oldest files go first once the directory holds more than kUnwindCacheBytes.
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(file.parent_path(), ec)) {
    if (e.path().extension() != ".gsut") continue;
    total += e.file_size(ec);
    files.emplace_back(e.last_write_time(ec), e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& [when, path] : files) {
    if (total <= kUnwindCacheBytes) break;
    total -= std::min<uint64_t>(total, fs::file_size(path, ec));
    fs::remove(path, ec);
  }
}

}  // namespace

namespace {

// The cache file of the file at `path` (by build id and size); empty without a build id.
std::filesystem::path cache_file(const std::string& path, const std::string& cache_dir) {
  if (cache_dir.empty()) return {};
  const std::string build_id = elf::read_build_id(path);
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (build_id.empty() || ec) return {};
  return std::filesystem::path(cache_dir) / (build_id + "-" + std::to_string(size) + ".gsut");
}

}  // namespace

CachedTable load_unwind_table(const std::string& path, const std::string& cache_dir,
                              const std::atomic<bool>* cancel) {
  const auto file = cache_file(path, cache_dir);
  if (file.empty()) return {compile_unwind_table(path, cancel), false};
  if (auto t = read_cached(file)) return {std::move(*t), true};
  CachedTable out{compile_unwind_table(path, cancel), false};
  write_cached(file, out.table);
  return out;
}

std::optional<UnwindTable> load_cached_unwind_table(const std::string& path, const std::string& cache_dir) {
  const auto file = cache_file(path, cache_dir);
  if (file.empty()) return std::nullopt;
  return read_cached(file);
}

}  // namespace gpuscope::symbolize
