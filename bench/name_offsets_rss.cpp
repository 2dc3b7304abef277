// What one pass over a library's symbols (elf::name_offsets, the agent's profile naming)
// costs: time, and how far it raises the process's peak resident memory — the symbol and string
// tables are read through a mapping of the file, and every page touched counts in RSS.
//   name_offsets_rss FILE...
#include <fcntl.h>
#include <gelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "elf/elf_file.h"

namespace {

long status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  return -1;
}

// The file's executable segments, as file offset ranges: where a profile's frames land.
std::vector<std::pair<uint64_t, uint64_t>> code_ranges(const char* path) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  elf_version(EV_CURRENT);
  const int fd = open(path, O_RDONLY);
  if (fd < 0) return out;
  if (Elf* elf = elf_begin(fd, ELF_C_READ, nullptr)) {
    size_t n = 0;
    elf_getphdrnum(elf, &n);
    for (size_t i = 0; i < n; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, int(i), &ph) && ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && ph.p_filesz)
        out.emplace_back(ph.p_offset, ph.p_filesz);
    }
    elf_end(elf);
  }
  close(fd);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("%-36s %9s %9s %10s %12s   %s\n", "file", "MB", "ms", "named", "peak RSS +MiB",
              "static-runtime check (defines_any_function): ms, peak RSS +MiB");
  for (int i = 1; i < argc; ++i) {
    struct stat st{};
    if (stat(argv[i], &st) != 0) continue;
    std::mt19937_64 rng(42);
    const auto code = code_ranges(argv[i]);
    if (code.empty()) continue;
    std::vector<uint64_t> offsets(500);
    for (auto& o : offsets) {
      const auto& [start, len] = code[rng() % code.size()];
      o = start + rng() % len;
    }
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
    const long before = status_kb("VmHWM:");
    const auto t0 = std::chrono::steady_clock::now();
    size_t named = 0;
    try {
      for (const auto& n : gpuscope::elf::name_offsets(argv[i], "", offsets)) named += !n.name.empty();
    } catch (const std::exception& e) {
      std::printf("%-36s error: %s\n", argv[i], e.what());
      continue;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double rss = double(status_kb("VmHWM:") - before) / 1024;
    // What the recorder and the agent ask of every library a CUDA process loads.
    std::ofstream("/proc/self/clear_refs") << "5";
    const long before_check = status_kb("VmHWM:");
    const auto t1 = std::chrono::steady_clock::now();
    const bool defines = gpuscope::elf::defines_any_function(argv[i], {"cudaLaunchKernel", "cudaMalloc"});
    const double check_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    std::printf("%-36s %9.1f %9.1f %10zu %12.1f   %.1f ms, %.1f MiB%s\n", argv[i] + std::string(argv[i]).rfind('/') + 1,
                double(st.st_size) / 1e6, ms, named, rss, check_ms, double(status_kb("VmHWM:") - before_check) / 1024,
                defines ? " (defines them)" : "");
  }
  return 0;
}
