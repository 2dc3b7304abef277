#include "elf/elf_file.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

namespace gpuscope::elf {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("cannot read ELF file " + path + ": " + why);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct ElfEnd {
  void operator()(Elf* e) const { elf_end(e); }
};

// An open, checked ELF file: the descriptor and the libelf handle, released together. Every
// table the headers describe lies inside the file, so a truncated file fails here rather than
// reading as one with fewer symbols.
class ElfHandle {
 public:
  explicit ElfHandle(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_.get() < 0) fail(path, std::strerror(errno));
    struct stat st{};
    if (fstat(fd_.get(), &st) != 0) fail(path, std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
    static const bool libelf_ready = elf_version(EV_CURRENT) != EV_NONE;
    if (!libelf_ready) fail(path, "libelf initialisation failed");
    elf_.reset(elf_begin(fd_.get(), ELF_C_READ_MMAP, nullptr));
    if (!elf_ || elf_kind(elf_.get()) != ELF_K_ELF) {
      char magic[SELFMAG] = {};
      const bool elf_magic = pread(fd_.get(), magic, SELFMAG, 0) == SELFMAG && memcmp(magic, ELFMAG, SELFMAG) == 0;
      fail(path, elf_magic ? "truncated or corrupt ELF header" : "not an ELF file");
    }
    check_extents(path, static_cast<uint64_t>(st.st_size));
  }

  Elf* get() const { return elf_.get(); }
  const GElf_Ehdr& header() const { return ehdr_; }

 private:
  void check_extents(const std::string& path, uint64_t file_size) {
    size_t nphdr = 0, nshdr = 0;
    if (!gelf_getehdr(elf_.get(), &ehdr_) || elf_getphdrnum(elf_.get(), &nphdr) != 0 ||
        elf_getshdrnum(elf_.get(), &nshdr) != 0)
      fail(path, std::string("truncated or corrupt ELF headers (") + elf_errmsg(-1) + ")");
    // libelf quietly drops a section header table that does not fit, which would read as a file
    // without symbols: the count the ELF header claims is checked (0 with e_shoff set means
    // extended numbering, whose count is in the first section header).
    uint64_t claimed_shdrs = ehdr_.e_shnum;
    if (claimed_shdrs == 0 && ehdr_.e_shoff != 0) claimed_shdrs = std::max<uint64_t>(nshdr, 1);
    uint64_t needed =
        std::max(ehdr_.e_phoff + nphdr * ehdr_.e_phentsize, ehdr_.e_shoff + claimed_shdrs * ehdr_.e_shentsize);
    for (size_t i = 0; i < nphdr; ++i) {
      GElf_Phdr ph;
      // The first that cannot be read ends the table: a crafted count runs to 2^32.
      if (!gelf_getphdr(elf_.get(), static_cast<int>(i), &ph)) break;
      if (ph.p_type == PT_LOAD) needed = std::max(needed, ph.p_offset + ph.p_filesz);
    }
    for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf_.get(), scn)) != nullptr;) {
      GElf_Shdr sh;
      if (gelf_getshdr(scn, &sh) && sh.sh_type != SHT_NOBITS) needed = std::max(needed, sh.sh_offset + sh.sh_size);
    }
    if (needed > file_size)
      fail(path,
           "truncated (" + std::to_string(file_size) + " bytes, its headers describe " + std::to_string(needed) + ")");
  }

  Fd fd_;
  std::unique_ptr<Elf, ElfEnd> elf_;  // after fd_: ended before the descriptor closes
  GElf_Ehdr ehdr_{};
};

std::string hex(const unsigned char* p, size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

std::string build_id_in(Elf_Data* notes) {
  if (!notes) return {};
  const auto* bytes = static_cast<const unsigned char*>(notes->d_buf);
  size_t off = 0, name_off = 0, desc_off = 0;
  GElf_Nhdr nh;
  while ((off = gelf_getnote(notes, off, &nh, &name_off, &desc_off)) > 0)
    if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && memcmp(bytes + name_off, "GNU", 4) == 0)
      return hex(bytes + desc_off, nh.n_descsz);
  return {};
}

// Program headers first (what the loader sees); note sections for files without them.
std::string build_id_of(Elf* elf) {
  size_t nphdr = 0;
  if (elf_getphdrnum(elf, &nphdr) == 0) {
    for (size_t i = 0; i < nphdr; ++i) {
      GElf_Phdr ph;
      if (!gelf_getphdr(elf, static_cast<int>(i), &ph)) break;  // past the table (a crafted count)
      if (ph.p_type != PT_NOTE) continue;
      const Elf_Type type = ph.p_align == 8 ? ELF_T_NHDR8 : ELF_T_NHDR;
      if (auto id = build_id_in(elf_getdata_rawchunk(elf, static_cast<int64_t>(ph.p_offset), ph.p_filesz, type));
          !id.empty())
        return id;
    }
  }
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn)) != nullptr;) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_NOTE) continue;
    if (auto id = build_id_in(elf_getdata(scn, nullptr)); !id.empty()) return id;
  }
  return {};
}

Elf_Data* first_section_data(Elf* elf, GElf_Word type) {
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn)) != nullptr;) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) && sh.sh_type == type) return elf_getdata(scn, nullptr);
  }
  return nullptr;
}

constexpr GElf_Versym kVersymHidden = 0x8000;  // a non-default version ("name@VER"), not in glibc's elf.h

// A defined symbol as a pass over a table sees it. Its name, and the rank that depends on the
// name's version suffix, are read from the string table only when asked for: a library with
// hundreds of thousands of long C++ names has a string table of 100+ MB whose pages all become
// resident if every name is read (a synthetic one in bench/symbol_pass_rss.py: +184 MiB), and
// name_offsets needs the names of the few symbols it keeps.
class FunctionSymbol {
 public:
  FunctionSymbol(uint64_t value, uint64_t size, const char* strtab, size_t strtab_size, size_t st_name,
                 int bind, bool hidden)
      : value(value), size(size), strtab_(strtab), strtab_size_(strtab_size), st_name_(st_name), bind_(bind),
        hidden_(hidden) {}
  uint64_t value, size;
  // Version suffix removed; points into the handle's string table. Empty: no usable name.
  std::string_view name() const {
    resolve();
    return name_;
  }
  // Which definition a name means when several have it: global over weak over local, and the
  // default version of a versioned name ("@@", not hidden) over the others.
  int rank() const {
    resolve();
    return rank_;
  }

 private:
  void resolve() const {
    if (resolved_) return;
    resolved_ = true;
    if (st_name_ >= strtab_size_) return;
    const size_t room = strtab_size_ - st_name_;
    const size_t len = strnlen(strtab_ + st_name_, room);
    if (len == 0 || len == room) return;
    name_ = std::string_view(strtab_ + st_name_, len);
    bool default_version = !hidden_;
    if (const size_t at = name_.find('@'); at != std::string_view::npos) {
      default_version = default_version && name_.substr(at).starts_with("@@");
      name_ = name_.substr(0, at);
    }
    rank_ = (bind_ == STB_LOCAL ? 0 : bind_ == STB_WEAK ? 2 : 4) + (default_version ? 1 : 0);
  }
  const char* strtab_;
  size_t strtab_size_, st_name_;
  int bind_;
  bool hidden_;
  mutable bool resolved_ = false;
  mutable std::string_view name_;
  mutable int rank_ = 0;
};

// Gives back the pages of [from, to) of a table read through libelf's read-only private mapping
// of the file: they are re-read from the page cache if touched again. A pass over libtorch's
// symbol table (tens of MB) would otherwise stay resident until the handle is closed.
void release_pages(const void* from, const void* to) {
  static const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t start = (uintptr_t(from) + page - 1) & ~(page - 1), end = uintptr_t(to) & ~(page - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
}

// Where in a string table each of `names` begins as a whole symbol name (followed by its end or
// a version, "@"; possibly the tail of a longer string, as linkers share tails) or, with
// `prefixes`, where each begins at all (a symbol whose name starts there starts with it), found by
// reading the table once in order and giving its pages back as the scan goes: a symbol pass
// that looks for a few names then touches no name it does not want. (.dynsym is ordered by
// hash, so reading its names symbol by symbol touches the whole string table at random.)
std::unordered_set<size_t> name_offsets_in_strtab(const char* strtab, size_t size, const std::vector<std::string>& names,
                                                  bool mapped, bool prefixes) {
  std::unordered_set<size_t> out;
  const std::string_view table(strtab, size);
  constexpr size_t kChunk = 4 << 20;
  size_t longest = 0;
  for (const auto& n : names) longest = std::max(longest, n.size());
  for (size_t chunk = 0; chunk < size; chunk += kChunk) {
    // Matches that start in this chunk; the search may read a name's length into the next one.
    const size_t end = std::min(size, chunk + kChunk);
    const std::string_view window = table.substr(chunk, end - chunk + std::min(longest + 1, size - end));
    for (const auto& n : names) {
      if (n.empty()) continue;
      for (size_t at = window.find(n); at != std::string_view::npos && chunk + at < end; at = window.find(n, at + 1)) {
        const size_t after = chunk + at + n.size();
        if (prefixes || (after < size && (strtab[after] == '\0' || strtab[after] == '@'))) out.insert(chunk + at);
      }
    }
    if (mapped) release_pages(strtab + chunk, strtab + end);
  }
  return out;
}

// Calls f for each defined function symbol (or, with `objects`, data object symbol) of .symtab
// and .dynsym, until f returns false. Symbols whose name f asks for and finds empty are f's to
// skip. With `only_names`, f sees only symbols that may have one of those names (or, with
// `prefixes`, whose names may start with one of them). `table`: SHT_SYMTAB or SHT_DYNSYM alone.
template <class F>
void for_each_symbol(Elf* elf, bool objects, F&& f, const std::vector<std::string>* only_names = nullptr,
                     bool prefixes = false, unsigned table = 0) {
  size_t file_size = 0;
  const char* file = elf_rawfile(elf, &file_size);  // the mapping libelf reads (ELF_C_READ_MMAP)
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn)) != nullptr;) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM) || sh.sh_entsize == 0 ||
        (table && sh.sh_type != table))
      continue;
    Elf_Data* syms = elf_getdata(scn, nullptr);
    Elf_Data* strs = elf_getdata(elf_getscn(elf, sh.sh_link), nullptr);
    if (!syms || !strs || !syms->d_buf || !strs->d_buf) continue;  // a table without bytes (NOBITS)
    Elf_Data* versyms = sh.sh_type == SHT_DYNSYM ? first_section_data(elf, SHT_GNU_versym) : nullptr;
    // The string table is read directly: elf_strptr's checks per call dominate on large libraries.
    const auto* strtab = static_cast<const char*>(strs->d_buf);
    const size_t strtab_size = strs->d_size;
    // What the section holds, not what its header claims (a crafted sh_size runs to 2^64).
    const size_t count = std::min<uint64_t>(sh.sh_size, syms->d_size) / sh.sh_entsize;
    const auto* table = static_cast<const char*>(syms->d_buf);
    const bool mapped = file && table >= file && table + syms->d_size <= file + file_size;
    const bool strtab_mapped = file && strtab >= file && strtab + strtab_size <= file + file_size;
    std::unordered_set<size_t> wanted_names;
    if (only_names) {
      wanted_names = name_offsets_in_strtab(strtab, strtab_size, *only_names, strtab_mapped, prefixes);
      if (wanted_names.empty()) continue;
    }
    // Every so many symbols the table's pages read so far, and the whole string table's, are
    // given back: a pass stays within a few MiB however large the library. Views of names stay
    // valid (the pages are read again from the page cache if touched); names are laid out
    // roughly in the order of their symbols, so few pages are read twice.
    constexpr size_t kReleaseEvery = 1 << 13;
    for (size_t i = 1; i < count; ++i) {  // entry 0 is the null symbol
      if (i % kReleaseEvery == 0) {
        if (mapped) release_pages(table + (i - kReleaseEvery) * sh.sh_entsize, table + i * sh.sh_entsize);
        if (strtab_mapped) release_pages(strtab, strtab + strtab_size);
      }
      GElf_Sym sym;
      if (!gelf_getsym(syms, static_cast<int>(i), &sym)) continue;
      const int type = GELF_ST_TYPE(sym.st_info);
      const bool wanted = objects ? type == STT_OBJECT : type == STT_FUNC || type == STT_GNU_IFUNC;
      if (!wanted || sym.st_shndx == SHN_UNDEF || sym.st_value == 0 || sym.st_name == 0) continue;
      if (only_names && !wanted_names.contains(sym.st_name)) continue;
      GElf_Versym ver = 0;
      const bool hidden = versyms && gelf_getversym(versyms, static_cast<int>(i), &ver) && (ver & kVersymHidden);
      if (!f(FunctionSymbol(sym.st_value, sym.st_size, strtab, strtab_size, sym.st_name, GELF_ST_BIND(sym.st_info), hidden)))
        return;
    }
  }
}

// The PT_LOAD segments: where a symbol's address (st_value) lies in the file.
struct LoadSegment {
  uint64_t vaddr, offset, filesz;
};
std::vector<LoadSegment> load_segments(Elf* elf) {
  std::vector<LoadSegment> loads;
  size_t nphdr = 0;
  elf_getphdrnum(elf, &nphdr);
  for (size_t i = 0; i < nphdr; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf, static_cast<int>(i), &ph)) break;  // past the table (a crafted count)
    if (ph.p_type == PT_LOAD) loads.push_back({ph.p_vaddr, ph.p_offset, ph.p_filesz});
  }
  return loads;
}

template <class F>
void for_each_function(Elf* elf, F&& f, const std::vector<std::string>* only_names = nullptr, bool prefixes = false,
                       unsigned table = 0) {
  for_each_symbol(elf, false, std::forward<F>(f), only_names, prefixes, table);
}

}  // namespace

std::unique_ptr<ElfFile> ElfFile::open(const std::string& path) {
  ElfHandle h(path);
  Elf* elf = h.get();
  std::unique_ptr<ElfFile> f(new ElfFile());
  f->build_id_ = build_id_of(elf);
  f->dynamic_ = h.header().e_type == ET_DYN;

  size_t nphdr = 0;
  elf_getphdrnum(elf, &nphdr);
  for (size_t i = 0; i < nphdr; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf, static_cast<int>(i), &ph)) break;  // past the table (a crafted count)
    if (ph.p_type == PT_LOAD) f->segments_.push_back({ph.p_vaddr, ph.p_offset, ph.p_filesz});
  }

  struct Candidate {
    std::string_view name;
    uint64_t offset, size;
    int rank;
  };
  std::vector<Candidate> all;
  for_each_function(elf, [&](const FunctionSymbol& s) {
    if (s.name().empty()) return true;
    if (auto off = f->vaddr_to_offset(s.value)) all.push_back({s.name(), *off, s.size, s.rank()});
    return true;
  });

  // By name: the best-ranked definition; ties go to the lowest offset so the choice is stable.
  std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.name != b.name) return a.name < b.name;
    return a.rank != b.rank ? a.rank > b.rank : a.offset < b.offset;
  });
  f->by_name_.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i)
    if (i == 0 || all[i].name != all[i - 1].name) f->by_name_.emplace(all[i].name, all[i].offset);

  // By offset: one symbol per offset, the one that best says what is there: sized, ranked, then
  // the public spelling of an alias ("malloc" over "__libc_malloc").
  const auto underscores = [](std::string_view n) { return n.find_first_not_of('_'); };
  std::sort(all.begin(), all.end(), [&](const Candidate& a, const Candidate& b) {
    if (a.offset != b.offset) return a.offset < b.offset;
    if ((a.size != 0) != (b.size != 0)) return a.size != 0;
    if (a.rank != b.rank) return a.rank > b.rank;
    if (a.size != b.size) return a.size > b.size;
    const size_t ua = underscores(a.name), ub = underscores(b.name);
    return ua != ub ? ua < ub : a.name < b.name;
  });
  f->by_offset_.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const Candidate& c = all[i];
    if (i > 0 && c.offset == all[i - 1].offset) continue;
    uint64_t end = c.offset + c.size;
    if (c.size == 0) {
      for (const auto& s : f->segments_)
        if (c.offset >= s.offset && c.offset < s.offset + s.filesz) end = s.offset + s.filesz;
    }
    f->by_offset_.push_back({ElfSymbol{std::string(c.name), c.offset, c.size}, end});
  }
  return f;
}

std::optional<uint64_t> ElfFile::vaddr_to_offset(uint64_t vaddr) const {
  for (const auto& s : segments_)
    if (vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz) return vaddr - s.vaddr + s.offset;
  return std::nullopt;
}

std::optional<uint64_t> ElfFile::offset_to_vaddr(uint64_t file_offset) const {
  for (const auto& s : segments_)
    if (file_offset >= s.offset && file_offset - s.offset < s.filesz) return file_offset - s.offset + s.vaddr;
  return std::nullopt;
}

std::unordered_map<std::string, uint64_t> ElfFile::function_offsets(const std::vector<std::string>& names) const {
  std::unordered_map<std::string, uint64_t> out;
  for (const auto& n : names)
    if (auto it = by_name_.find(n); it != by_name_.end()) out.emplace(n, it->second);
  return out;
}

bool ElfFile::has_function(const std::string& name) const { return by_name_.contains(name); }

std::optional<std::pair<ElfSymbol, uint64_t>> ElfFile::symbolize(uint64_t file_offset) const {
  auto it = std::upper_bound(by_offset_.begin(), by_offset_.end(), file_offset,
                             [](uint64_t off, const Indexed& s) { return off < s.symbol.file_offset; });
  if (it == by_offset_.begin()) return std::nullopt;
  --it;
  if (file_offset >= it->end) return std::nullopt;
  return std::make_pair(it->symbol, file_offset - it->symbol.file_offset);
}

std::string demangle(const std::string& name) {
  if (!name.starts_with("_Z")) return name;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  int status = 0;
  std::unique_ptr<char, Free> out(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status));
  return status == 0 && out ? std::string(out.get()) : name;
}

std::vector<OffsetName> name_offsets(const std::string& path, const std::string& expected_build_id,
                                     const std::vector<uint64_t>& file_offsets) {
  ElfHandle h(path);
  Elf* elf = h.get();
  if (!expected_build_id.empty() && build_id_of(elf) != expected_build_id)
    throw std::runtime_error(path + ": another build than the one that ran");
  const std::vector<LoadSegment> loads = load_segments(elf);
  // The offsets sorted (with where each came from), and per offset the best symbol so far: the
  // one starting closest below it, the better-ranked of names at one address.
  std::vector<std::pair<uint64_t, size_t>> sorted;
  for (size_t i = 0; i < file_offsets.size(); ++i) sorted.emplace_back(file_offsets[i], i);
  std::sort(sorted.begin(), sorted.end());
  struct Best {
    uint64_t start = 0, end = 0;
    int rank = -1;
    std::string name;
  };
  std::vector<Best> best(sorted.size());
  for_each_function(elf, [&](const FunctionSymbol& s) {
    if (s.size == 0) return true;
    for (const auto& l : loads) {
      if (s.value < l.vaddr || s.value >= l.vaddr + l.filesz) continue;
      const uint64_t start = s.value - l.vaddr + l.offset, end = start + s.size;
      auto it = std::lower_bound(sorted.begin(), sorted.end(), std::make_pair(start, size_t(0)));
      // Only a symbol that covers a wanted offset has its name read.
      if (it == sorted.end() || it->first >= end || s.name().empty()) break;
      const std::string_view name = s.name();
      for (; it != sorted.end() && it->first < end; ++it) {
        Best& b = best[size_t(it - sorted.begin())];
        if (start > b.start || b.rank < 0 || (start == b.start && s.rank() > b.rank)) {
          b.start = start;
          b.end = end;
          b.rank = s.rank();
          b.name.assign(name);
        }
      }
      break;
    }
    return true;
  });
  std::vector<OffsetName> out(file_offsets.size());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (!best[i].name.empty()) out[sorted[i].second] = {demangle(best[i].name), best[i].start, best[i].end};
  return out;
}

bool defines_any_function(const std::string& path, const std::vector<std::string>& names) {
  try {
    ElfHandle h(path);
    bool found = false;
    for_each_function(
        h.get(),
        [&](const FunctionSymbol& s) {
          found = std::find(names.begin(), names.end(), s.name()) != names.end();
          return !found;
        },
        &names);
    return found;
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<FunctionRange> functions_with_prefixes(const std::string& path, const std::vector<std::string>& prefixes) {
  ElfHandle h(path);
  Elf* elf = h.get();
  const std::vector<LoadSegment> loads = load_segments(elf);
  std::vector<FunctionRange> out;
  auto visit = [&](const FunctionSymbol& s) {
    const std::string_view name = s.name();
    // Split-off parts (".cold", ".part.0") are not the function's entry.
    if (s.size == 0 || name.find('.') != std::string_view::npos) return true;
    for (const auto& p : prefixes) {
      if (!name.starts_with(p)) continue;
      for (const auto& l : loads) {
        if (s.value < l.vaddr || s.value >= l.vaddr + l.filesz) continue;
        const uint64_t start = s.value - l.vaddr + l.offset;
        // .symtab and .dynsym both name an exported function.
        const bool known = std::any_of(out.begin(), out.end(), [&](const FunctionRange& r) { return r.start == start; });
        if (!known) out.push_back({std::string(name), start, start + s.size});
        break;
      }
      break;
    }
    return true;
  };
  // Exported functions are in .dynsym, a fraction of .symtab (searching all of libtorch_cpu's
  // tables took 300-400 ms on the H100 machine): .symtab only for prefixes .dynsym lacks.
  for_each_function(elf, visit, &prefixes, true, SHT_DYNSYM);
  std::vector<std::string> missing;
  for (const auto& p : prefixes)
    if (std::none_of(out.begin(), out.end(), [&](const FunctionRange& r) { return r.name.starts_with(p); }))
      missing.push_back(p);
  if (!missing.empty()) for_each_function(elf, visit, &missing, true, SHT_SYMTAB);
  std::sort(out.begin(), out.end(), [](const FunctionRange& a, const FunctionRange& b) { return a.start < b.start; });
  return out;
}

std::unordered_map<std::string, ElfObject> object_symbols(const std::string& path,
                                                         const std::vector<std::string>& names) {
  std::unordered_map<std::string, ElfObject> out;
  std::unordered_map<std::string, int> rank;
  ElfHandle h(path);
  for_each_symbol(
      h.get(), true,
      [&](const FunctionSymbol& s) {
        const std::string name(s.name());
        if (name.empty() || std::find(names.begin(), names.end(), name) == names.end()) return true;
        if (auto r = rank.find(name); r == rank.end() || r->second < s.rank()) {
          rank[name] = s.rank();
          out[name] = ElfObject{s.value, s.size};
        }
        return true;
      },
      &names);
  return out;
}

std::string read_build_id(const std::string& path) {
  try {
    ElfHandle h(path);
    return build_id_of(h.get());
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace gpuscope::elf
