// ELF symbols for attaching (name -> file offset) and naming (file offset -> function), on real
// files: this test binary and the CUDA runtime.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "discover/proc.h"
#include "elf/elf_file.h"
#include "symbolize/process_maps.h"
#include "symbolize/symbolizer.h"

using namespace gpuscope::symbolize;
using namespace gpuscope::elf;
namespace discover = gpuscope::discover;

// Big enough that an offset into its middle is still inside it.
extern "C" __attribute__((noinline, used)) int gpuscope_test_marker(int n) {
  volatile int acc = 0;
  for (int i = 0; i < n; ++i) acc = acc * 31 + i;
  return acc;
}

namespace gpuscope_test {
__attribute__((noinline, used)) int cxx_marker(int n) { return gpuscope_test_marker(n) + 1; }
}  // namespace gpuscope_test

namespace {

const char* kCudart = "/usr/local/cuda/lib64/libcudart.so.13";

// Where the running process has a code address, as a file offset: what a uprobe or a stack walk sees.
uint64_t runtime_file_offset(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    uint64_t start = 0, end = 0, offset = 0;
    char dash = 0;
    std::string perms;
    in >> std::hex >> start >> dash >> end >> perms >> offset;
    const auto a = reinterpret_cast<uint64_t>(addr);
    if (a >= start && a < end) return a - start + offset;
  }
  ADD_FAILURE() << "no mapping holds " << addr;
  return 0;
}

// A file in the temp directory, removed at scope exit.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& content)
      : path_(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()))) {
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

std::string open_error(const std::string& path) {
  try {
    ElfFile::open(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string file_prefix(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

}  // namespace

TEST(ElfFile, OffsetsAndSymbolsRoundTripOnThisBinary) {
  auto elf = ElfFile::open("/proc/self/exe");
  auto offsets = elf->function_offsets({"gpuscope_test_marker", "no_such_function"});
  ASSERT_EQ(offsets.count("gpuscope_test_marker"), 1u);
  EXPECT_EQ(offsets.count("no_such_function"), 0u);
  EXPECT_TRUE(elf->has_function("gpuscope_test_marker"));
  EXPECT_FALSE(elf->has_function("no_such_function"));

  const uint64_t off = offsets["gpuscope_test_marker"];
  EXPECT_EQ(off, runtime_file_offset(reinterpret_cast<const void*>(&gpuscope_test_marker)));

  auto start = elf->symbolize(off);
  ASSERT_TRUE(start);
  EXPECT_EQ(start->first.name, "gpuscope_test_marker");
  EXPECT_EQ(start->first.file_offset, off);
  EXPECT_EQ(start->second, 0u);
  const uint64_t size = start->first.size;
  ASSERT_GT(size, 4u);

  auto mid = elf->symbolize(off + size / 2);
  ASSERT_TRUE(mid);
  EXPECT_EQ(mid->first.name, "gpuscope_test_marker");
  EXPECT_EQ(mid->second, size / 2);
  auto last = elf->symbolize(off + size - 1);
  ASSERT_TRUE(last);
  EXPECT_EQ(last->first.name, "gpuscope_test_marker");
  auto past = elf->symbolize(off + size);
  EXPECT_TRUE(!past || past->first.name != "gpuscope_test_marker");

  const auto vaddr = elf->offset_to_vaddr(off);
  ASSERT_TRUE(vaddr);
  EXPECT_EQ(elf->vaddr_to_offset(*vaddr), off);

  EXPECT_TRUE(defines_any_function("/proc/self/exe", {"no_such_function", "gpuscope_test_marker"}));
  EXPECT_FALSE(defines_any_function("/proc/self/exe", {"no_such_function"}));
}

TEST(ElfFile, VersionedDynamicSymbolsOfTheRealCudart) {
  if (!std::filesystem::exists(kCudart)) GTEST_SKIP() << kCudart << " is absent";
  auto elf = ElfFile::open(kCudart);
  EXPECT_EQ(elf->build_id(), "2a12a4a442f0edf6eab8241fdeedb40019c4256c");
  EXPECT_EQ(read_build_id(kCudart), elf->build_id());
  EXPECT_TRUE(elf->is_executable_pie_or_shared());

  // .dynsym names carry @@libcudart.so.13; the plain names find them.
  auto offsets = elf->function_offsets({"cudaMalloc", "cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaNoSuchCall"});
  ASSERT_EQ(offsets.size(), 3u);
  EXPECT_EQ(offsets["cudaMalloc"], 0x50ad0u);
  EXPECT_EQ(offsets["cudaLaunchKernel"], 0x74370u);
  EXPECT_EQ(offsets["cudaLaunchKernel_ptsz"], 0x4e6b0u);
  EXPECT_FALSE(elf->has_function("cudaMalloc@@libcudart.so.13"));

  auto inside = elf->symbolize(offsets["cudaLaunchKernel"] + 0x10);
  ASSERT_TRUE(inside);
  EXPECT_EQ(inside->first.name, "cudaLaunchKernel");
  EXPECT_EQ(inside->second, 0x10u);
  EXPECT_TRUE(defines_any_function(kCudart, {"cudaMalloc"}));
}

TEST(ElfFile, FunctionsFoundByThePrefixOfTheirNames) {
  // This binary's own function is in .symtab alone: looked for there when .dynsym lacks it.
  const auto exe = functions_with_prefixes("/proc/self/exe", {"gpuscope_test_mark", "no_such_prefix_"});
  ASSERT_EQ(exe.size(), 1u);
  EXPECT_EQ(exe[0].name, "gpuscope_test_marker");
  EXPECT_EQ(exe[0].start, runtime_file_offset(reinterpret_cast<const void*>(&gpuscope_test_marker)));
  EXPECT_GT(exe[0].end, exe[0].start);
  EXPECT_TRUE(functions_with_prefixes("/proc/self/exe", {"no_such_prefix_"}).empty());

  if (!std::filesystem::exists(kCudart)) GTEST_SKIP() << kCudart << " is absent";
  // Every launch function of the runtime, versioned names included, each once, by offset.
  const auto launches = functions_with_prefixes(kCudart, {"cudaLaunchKernel"});
  std::map<std::string, uint64_t> found;
  for (const auto& f : launches) found[f.name] = f.start;
  EXPECT_EQ(found.size(), launches.size());
  EXPECT_EQ(found["cudaLaunchKernel"], 0x74370u);
  EXPECT_EQ(found["cudaLaunchKernel_ptsz"], 0x4e6b0u);
  EXPECT_TRUE(std::is_sorted(launches.begin(), launches.end(),
                             [](const FunctionRange& a, const FunctionRange& b) { return a.start < b.start; }));
}

TEST(ElfFile, BadFilesGiveAClearError) {
  const std::string missing = "/nonexistent/lib.so";
  EXPECT_THROW(ElfFile::open(missing), std::runtime_error);
  std::string why = open_error(missing);
  EXPECT_NE(why.find(missing), std::string::npos) << why;
  EXPECT_NE(why.find("No such file or directory"), std::string::npos) << why;

  TempFile text("gpuscope-not-elf.txt", "not an ELF file, just text\n");
  why = open_error(text.path());
  EXPECT_NE(why.find(text.path()), std::string::npos) << why;
  EXPECT_NE(why.find("not an ELF file"), std::string::npos) << why;
  EXPECT_EQ(read_build_id(text.path()), "");
  EXPECT_FALSE(defines_any_function(text.path(), {"main"}));

  why = open_error(std::filesystem::temp_directory_path().string());
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;

  TempFile header_only("gpuscope-elf-header", file_prefix("/proc/self/exe", 10));
  why = open_error(header_only.path());
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;

  // Section headers (and symbol tables) are past the first 64 KiB of any useful binary.
  TempFile cut("gpuscope-elf-cut", file_prefix("/proc/self/exe", 64 * 1024));
  why = open_error(cut.path());
  EXPECT_NE(why.find(cut.path()), std::string::npos) << why;
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
  EXPECT_FALSE(defines_any_function(cut.path(), {"gpuscope_test_marker"}));
}

TEST(Demangle, ItaniumNamesAndPlainOnes) {
  EXPECT_EQ(demangle("_Z6vecAddPfS_S_i"), "vecAdd(float*, float*, float*, int)");
  EXPECT_EQ(demangle("plain_c_name"), "plain_c_name");
  EXPECT_EQ(demangle("_Znot_really_mangled"), "_Znot_really_mangled");
  // nvcc's anonymous namespaces read as the compiler's demangler writes them.
  EXPECT_EQ(demangle("_ZN2at6native43_GLOBAL__N__50f1b6c4_10_Dropout_cu_0e96ed385helloEv"),
            "at::native::(anonymous namespace)::hello()");
}

TEST(Symbolizer, ChecksBuildIdsAndNeverThrows) {
  auto elf = ElfFile::open("/proc/self/exe");
  const uint64_t off = elf->function_offsets({"gpuscope_test_marker"}).at("gpuscope_test_marker");
  Symbolizer sym;
  Frame f = sym.resolve("/proc/self/exe", elf->build_id(), off + 3);
  EXPECT_EQ(f.module, "/proc/self/exe");
  EXPECT_EQ(f.file_offset, off + 3);
  EXPECT_EQ(f.function, "gpuscope_test_marker");
  EXPECT_EQ(f.offset_in_function, 3u);
  EXPECT_EQ(sym.resolve("/proc/self/exe", "", off).function, "gpuscope_test_marker");
  // A file that changed since the recording (another build id) names nothing rather than lie.
  EXPECT_EQ(sym.resolve("/proc/self/exe", "00000000", off).function, "");
  EXPECT_EQ(sym.resolve("/nonexistent", "", off).function, "");
  TempFile text("gpuscope-symbolizer-text", "hello\n");
  EXPECT_EQ(sym.resolve(text.path(), "", 0).function, "");
}

TEST(Symbolizer, DemanglesAndSurvivesEviction) {
  if (!std::filesystem::exists(kCudart)) GTEST_SKIP() << kCudart << " is absent";
  auto exe = ElfFile::open("/proc/self/exe");
  const uint64_t marker = exe->function_offsets({"gpuscope_test_marker"}).at("gpuscope_test_marker");
  const uint64_t malloc_off = ElfFile::open(kCudart)->function_offsets({"cudaMalloc"}).at("cudaMalloc");
  Symbolizer sym(1);  // every switch of file evicts the other
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(sym.resolve("/proc/self/exe", "", marker).function, "gpuscope_test_marker");
    EXPECT_EQ(sym.resolve(kCudart, "", malloc_off).function, "cudaMalloc");
  }
  // A C++ function comes back demangled, its symbol table name kept beside it.
  Frame f =
      sym.resolve("/proc/self/exe", "", runtime_file_offset(reinterpret_cast<const void*>(&gpuscope_test::cxx_marker)));
  EXPECT_EQ(f.function, "gpuscope_test::cxx_marker(int)");
  EXPECT_EQ(f.raw_function, "_ZN13gpuscope_test10cxx_markerEi");
  EXPECT_EQ(f.offset_in_function, 0u);
}

// A function with another inlined into it, at known lines.
static inline __attribute__((always_inline)) int gpuscope_test_inlined_helper(int n) {
  return n * 3 + 1;  // kInlinedBodyLine
}
constexpr int kInlinedBodyLine = __LINE__ - 2;
extern "C" __attribute__((noinline, used)) int gpuscope_test_calls_inline(volatile int n) {
  return gpuscope_test_inlined_helper(n);  // kCallLine
}
constexpr int kCallLine = __LINE__ - 2;

TEST(Symbolizer, SourceLinesAndInlinedFunctionsFromDwarf) {
  auto elf = ElfFile::open("/proc/self/exe");
  const uint64_t start = elf->function_offsets({"gpuscope_test_calls_inline"}).at("gpuscope_test_calls_inline");
  if (!elf->function_offsets({"_ZL28gpuscope_test_inlined_helperi"}).empty())
    GTEST_SKIP() << "the helper was not inlined in this build (clang -O0 with ASan keeps it a function)";
  Symbolizer sym;
  // Walk the function's bytes: some instruction comes from the inlined helper (past a longer
  // prologue in a sanitized -O0 build).
  bool saw_inlined = false, saw_line = false;
  for (uint64_t off = start; off < start + 1024; ++off) {
    auto f = sym.resolve("/proc/self/exe", "", off, true);
    if (f.function != "gpuscope_test_calls_inline") break;
    if (!f.source) GTEST_SKIP() << "this test binary has no DWARF line information (built without -g)";
    EXPECT_TRUE(f.source->location.file.ends_with("test_symbolize.cpp")) << f.source->location.file;
    if (!f.source->inlined.empty()) {
      saw_inlined = true;
      // A static function has no linkage name in DWARF: its plain name.
      EXPECT_EQ(f.source->inlined, std::vector<std::string>{"gpuscope_test_inlined_helper"});
      EXPECT_EQ(f.source->location.line, kInlinedBodyLine);
      EXPECT_EQ(f.source->in_function.line, kCallLine);  // where the helper is called
    }
    saw_line |= f.source->in_function.line == kCallLine;
  }
  EXPECT_TRUE(saw_inlined);
  EXPECT_TRUE(saw_line);
  // Without asking, no DWARF is read.
  EXPECT_FALSE(sym.resolve("/proc/self/exe", "", start, false).source);
}

TEST(Symbolizer, SourceLinesOfAClangBinaryWithoutAddressRanges) {
  // clang writes no .debug_aranges, which libdw 0.188 needs to find a compile unit by address:
  // every frame in code built by clang went without its line. Units are found from their ranges.
  const auto dir = std::filesystem::temp_directory_path() / ("gpuscope_clang_lines_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream src(dir / "f.c");
    src << "int unused(int x) { return x + 1; }\n"
           "int gpuscope_clang_f(int x) {\n"
           "  return x * 3;\n"
           "}\n"
           "int main(int c, char** v) { (void)v; return gpuscope_clang_f(c); }\n";
  }
  const std::string bin = (dir / "f").string();
  if (std::system(("clang -g -O1 -o " + bin + " " + (dir / "f.c").string() + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "no clang here";
  const uint64_t start = ElfFile::open(bin)->function_offsets({"gpuscope_clang_f"}).at("gpuscope_clang_f");
  Symbolizer sym;
  const auto f = sym.resolve(bin, "", start, true);
  ASSERT_TRUE(f.source);
  EXPECT_TRUE(f.source->location.file.ends_with("f.c")) << f.source->location.file;
  EXPECT_GE(f.source->location.line, 2);
  EXPECT_LE(f.source->location.line, 3);
  std::filesystem::remove_all(dir);
}

TEST(ProcessMaps, AMissReReadsTheMapsOnlyWhenAFileMapsTheAddressNow) {
  namespace fs = std::filesystem;
  // PROCMAP_QUERY came with Linux 6.11; before it a miss re-reads on a back-off instead.
  utsname u{};
  uname(&u);
  int major = 0, minor = 0;
  std::sscanf(u.release, "%d.%d", &major, &minor);
  if (major < 6 || (major == 6 && minor < 11)) GTEST_SKIP() << "kernel " << u.release << " has no PROCMAP_QUERY";
  const pid_t pid = getpid();
  ProcessMaps maps;
  ASSERT_TRUE(maps.refresh(pid));
  const uint64_t reads = maps.reads();
  // Frame-pointer walks through code without frame pointers give such addresses: in no file.
  void* anon = mmap(nullptr, 1 << 16, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anon, MAP_FAILED);
  usleep(30'000);  // past the shortest interval between two reads: a back-off alone would re-read
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(maps.resolve(pid, 0x1000 + uint64_t(i)));
    EXPECT_FALSE(maps.resolve(pid, reinterpret_cast<uint64_t>(anon) + uint64_t(i)));
  }
  EXPECT_EQ(maps.reads(), reads);
  munmap(anon, 1 << 16);
  // A library loaded after the snapshot: found at its first miss, without waiting out a back-off.
  const fs::path dir = fs::temp_directory_path() / ("gpuscope-maps-" + std::to_string(pid));
  fs::create_directories(dir);
  const fs::path copy = dir / "libgpuscope_maps_test.so";
  fs::copy_file("/usr/lib/x86_64-linux-gnu/libbz2.so.1.0", copy, fs::copy_options::overwrite_existing);
  void* lib = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const auto fn = reinterpret_cast<uint64_t>(dlsym(lib, "BZ2_bzlibVersion"));
  ASSERT_NE(fn, 0u);
  usleep(30'000);  // past the shortest interval between two reads
  const auto found = maps.resolve(pid, fn);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->path, copy.string());
  EXPECT_EQ(maps.reads(), reads + 1);
  // One loaded just after a read of the maps (a snapshot taken at its load while the loader was
  // still mapping it): found at once, not 20 ms later (a stack unwound meanwhile lost its frame).
  const fs::path second = dir / "libgpuscope_maps_test2.so";
  fs::copy_file("/usr/lib/x86_64-linux-gnu/libbz2.so.1.0", second, fs::copy_options::overwrite_existing);
  ASSERT_TRUE(maps.refresh(pid));
  void* lib2 = dlopen(second.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib2, nullptr) << dlerror();
  const auto found2 = maps.resolve(pid, reinterpret_cast<uint64_t>(dlsym(lib2, "BZ2_bzlibVersion")));
  ASSERT_TRUE(found2);
  EXPECT_EQ(found2->path, second.string());
  dlclose(lib2);
  dlclose(lib);
  fs::remove_all(dir);
}

TEST(ProcessMaps, AProcessThatExitedKeepsItsLastSnapshot) {
  // A zombie (exited, not yet waited for) has no mappings left to list: the snapshot taken while it
  // ran stays, as it must for a process whose memory is being torn down (partial lists).
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    close(go[1]);
    [[maybe_unused]] auto n = read(go[0], &c, 1);
    _exit(0);
  }
  close(go[0]);
  EXPECT_FALSE(discover::process_exiting(child));
  ProcessMaps maps;
  ASSERT_TRUE(maps.refresh(child));
  const auto before = maps.mappings(child);
  ASSERT_FALSE(before.empty());
  close(go[1]);
  for (int i = 0; i < 200 && !discover::process_exiting(child); ++i) usleep(5'000);
  EXPECT_TRUE(discover::process_exiting(child));
  EXPECT_FALSE(maps.refresh(child));  // nothing listed any more
  EXPECT_EQ(maps.mappings(child).size(), before.size());
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(discover::process_exiting(child));  // gone
  EXPECT_FALSE(discover::process_exiting(getpid()));
}

TEST(ProcessMaps, ALastingPathIsOursWhereItNamesTheSameFile) {
  // The C library this test maps: the same file in our root, by device and inode.
  for (const auto& m : discover::read_maps(getpid())) {
    if (m.path.find("/libc.so") == std::string::npos) continue;
    EXPECT_EQ(lasting_path(getpid(), m), m.path);
    discover::Mapping other = m;
    other.inode += 1;  // another file of that name (a container's): through the process's root
    EXPECT_EQ(lasting_path(getpid(), other), "/proc/" + std::to_string(getpid()) + "/root" + m.path);
    return;
  }
  FAIL() << "no libc mapping";
}
