// How long compiling a file's call frame information into unwind rows takes, and how many rows
// it makes (src/symbolize/unwind_table.h): what the BPF walker's table memory costs per library.
//   unwind_tables FILE...
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "symbolize/unwind_table.h"

// With --cache DIR first: each file is also loaded through the table cache twice (the first
// writes it), to time reading a compiled table back.
int main(int argc, char** argv) {
  using namespace gpuscope::symbolize;
  std::string cache;
  if (argc > 2 && std::string(argv[1]) == "--cache") {
    cache = argv[2];
    argv += 2;
    argc -= 2;
  }
  std::printf("%-44s %9s %9s %9s %9s %8s %6s %6s %6s %s\n", "file", "MB", "fdes", "ranges", "rows", "ms",
              "bad_cfa", "bad_bp", "bad_ra", "source");
  for (int i = 1; i < argc; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const UnwindTable t = compile_unwind_table(argv[i]);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%-44s %9.1f %9zu %9zu %9zu %8.1f %6zu %6zu %6zu %s (%.1f MiB of rows and index)\n",
                  std::filesystem::path(argv[i]).filename().c_str(), std::filesystem::file_size(argv[i]) / 1e6,
                  t.stats.fdes, t.stats.ranges, t.rows.size(), ms, t.stats.unsupported_cfa, t.stats.unsupported_rbp,
                  t.stats.unsupported_ra, t.stats.source.c_str(), t.bytes() / 1048576.0);
      if (!cache.empty()) {
        const auto c0 = std::chrono::steady_clock::now();
        const CachedTable first = load_unwind_table(argv[i], cache);
        const auto c1 = std::chrono::steady_clock::now();
        const CachedTable again = load_unwind_table(argv[i], cache);
        const auto c2 = std::chrono::steady_clock::now();
        std::printf("%-44s   cache: first load %.1f ms (%s), read back %.1f ms (%s, %s)\n", "",
                    std::chrono::duration<double, std::milli>(c1 - c0).count(), first.from_cache ? "hit" : "miss",
                    std::chrono::duration<double, std::milli>(c2 - c1).count(), again.from_cache ? "hit" : "miss",
                    again.table.rows.size() == t.rows.size() ? "same rows" : "ROWS DIFFER");
      }
    } catch (const std::exception& e) {
      std::printf("%-44s error: %s\n", argv[i], e.what());
    }
  }
  return 0;
}
