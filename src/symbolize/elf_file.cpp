#include "symbolize/elf_file.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace gpuscope::symbolize {
namespace {

// Owns the descriptor and the libelf handle together.
class ElfHandle {
 public:
  explicit ElfHandle(const std::string& path) {
    static const bool init = elf_version(EV_CURRENT) != EV_NONE;
    if (!init) throw std::runtime_error("libelf initialisation failed");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error(path + ": " + strerror(errno));
    elf_ = elf_begin(fd_, ELF_C_READ_MMAP, nullptr);
    if (!elf_ || elf_kind(elf_) != ELF_K_ELF) {
      const std::string why = elf_ ? "not an ELF file" : elf_errmsg(-1);
      close();
      throw std::runtime_error(path + ": " + why);
    }
  }
  ~ElfHandle() { close(); }
  ElfHandle(const ElfHandle&) = delete;
  ElfHandle& operator=(const ElfHandle&) = delete;
  Elf* get() const { return elf_; }

 private:
  void close() {
    if (elf_) elf_end(elf_);
    if (fd_ >= 0) ::close(fd_);
    elf_ = nullptr;
    fd_ = -1;
  }
  int fd_ = -1;
  Elf* elf_ = nullptr;
};

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

std::string build_id_of(Elf* elf) {
  size_t nphdr = 0;
  if (elf_getphdrnum(elf, &nphdr) != 0) return {};
  for (size_t i = 0; i < nphdr; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf, i, &ph) || ph.p_type != PT_NOTE) continue;
    Elf_Data* data = elf_getdata_rawchunk(elf, ph.p_offset, ph.p_filesz, ELF_T_NHDR);
    if (!data) continue;
    size_t off = 0, name_off, desc_off;
    GElf_Nhdr nh;
    while ((off = gelf_getnote(data, off, &nh, &name_off, &desc_off)) > 0) {
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          memcmp(static_cast<char*>(data->d_buf) + name_off, "GNU", 4) == 0)
        return hex(static_cast<unsigned char*>(data->d_buf) + desc_off, nh.n_descsz);
    }
  }
  return {};
}

}  // namespace

std::unique_ptr<ElfFile> ElfFile::open(const std::string& path) {
  ElfHandle h(path);
  Elf* elf = h.get();
  auto f = std::unique_ptr<ElfFile>(new ElfFile());
  f->build_id_ = build_id_of(elf);

  size_t nphdr = 0;
  if (elf_getphdrnum(elf, &nphdr) != 0) throw std::runtime_error(path + ": truncated or corrupt ELF headers");
  for (size_t i = 0; i < nphdr; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, i, &ph) && ph.p_type == PT_LOAD)
      f->segments_.push_back({ph.p_vaddr, ph.p_offset, ph.p_filesz});
  }

  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM)) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data || sh.sh_entsize == 0) continue;
    const size_t count = sh.sh_size / sh.sh_entsize;
    for (size_t i = 0; i < count; ++i) {
      GElf_Sym sym;
      if (!gelf_getsym(data, static_cast<int>(i), &sym)) continue;
      const int type = GELF_ST_TYPE(sym.st_info);
      if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym.st_shndx == SHN_UNDEF || sym.st_value == 0) continue;
      const char* raw = elf_strptr(elf, sh.sh_link, sym.st_name);
      if (!raw || !*raw) continue;
      std::string name(raw);
      if (auto at = name.find('@'); at != std::string::npos) name.resize(at);
      auto off = f->vaddr_to_offset(sym.st_value);
      if (!off) continue;
      f->by_name_.emplace(name, *off);
      f->by_offset_.push_back({std::move(name), *off, sym.st_size});
    }
  }
  std::sort(f->by_offset_.begin(), f->by_offset_.end(), [](const auto& a, const auto& b) {
    return a.file_offset != b.file_offset ? a.file_offset < b.file_offset : a.size > b.size;
  });
  f->by_offset_.erase(std::unique(f->by_offset_.begin(), f->by_offset_.end(),
                                  [](const auto& a, const auto& b) { return a.file_offset == b.file_offset; }),
                      f->by_offset_.end());
  return f;
}

std::optional<uint64_t> ElfFile::vaddr_to_offset(uint64_t vaddr) const {
  for (const auto& s : segments_)
    if (vaddr >= s.vaddr && vaddr < s.vaddr + s.filesz) return vaddr - s.vaddr + s.offset;
  return std::nullopt;
}

std::unordered_map<std::string, uint64_t> ElfFile::function_offsets(const std::vector<std::string>& names) const {
  std::unordered_map<std::string, uint64_t> out;
  for (const auto& n : names)
    if (auto it = by_name_.find(n); it != by_name_.end()) out.emplace(n, it->second);
  return out;
}

bool ElfFile::has_function(const std::string& name) const { return by_name_.count(name) > 0; }

std::optional<std::pair<ElfSymbol, uint64_t>> ElfFile::symbolize(uint64_t file_offset) const {
  auto it = std::upper_bound(by_offset_.begin(), by_offset_.end(), file_offset,
                             [](uint64_t off, const ElfSymbol& s) { return off < s.file_offset; });
  if (it == by_offset_.begin()) return std::nullopt;
  --it;
  const uint64_t delta = file_offset - it->file_offset;
  // A sized symbol must contain the offset; an unsized one (hand-written assembly) is taken
  // as extending to the next symbol.
  if (it->size && delta >= it->size) return std::nullopt;
  return std::make_pair(*it, delta);
}

std::string demangle(const std::string& name) {
  if (!name.starts_with("_Z")) return name;
  int status = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !out) return name;
  std::string s(out);
  free(out);
  return s;
}

bool defines_any_function(const std::string& path, const std::vector<std::string>& names) {
  try {
    ElfHandle h(path);
    Elf* elf = h.get();
    Elf_Scn* scn = nullptr;
    while ((scn = elf_nextscn(elf, scn)) != nullptr) {
      GElf_Shdr sh;
      if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM)) continue;
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (!data || sh.sh_entsize == 0) continue;
      const size_t count = sh.sh_size / sh.sh_entsize;
      for (size_t i = 0; i < count; ++i) {
        GElf_Sym sym;
        if (!gelf_getsym(data, static_cast<int>(i), &sym) || sym.st_shndx == SHN_UNDEF ||
            GELF_ST_TYPE(sym.st_info) != STT_FUNC)
          continue;
        const char* raw = elf_strptr(elf, sh.sh_link, sym.st_name);
        if (!raw) continue;
        const std::string_view name(raw, strcspn(raw, "@"));
        for (const auto& n : names)
          if (name == n) return true;
      }
    }
  } catch (const std::exception&) {
  }
  return false;
}

std::string read_build_id(const std::string& path) {
  try {
    ElfHandle h(path);
    return build_id_of(h.get());
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace gpuscope::symbolize
