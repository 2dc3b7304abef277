// ELF symbols for attaching (name -> file offset) and naming (file offset -> function).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "symbolize/elf_file.h"
#include "symbolize/symbolizer.h"

using namespace gpuscope::symbolize;

extern "C" __attribute__((noinline, used)) int gpuscope_test_marker(int x) { return x * 3 + 1; }

namespace {

const char* kCudart = "/usr/local/cuda/lib64/libcudart.so.13";

}  // namespace

TEST(ElfFile, OffsetsAndSymbolsRoundTripOnThisBinary) {
  auto elf = ElfFile::open("/proc/self/exe");
  auto offsets = elf->function_offsets({"gpuscope_test_marker", "no_such_function"});
  ASSERT_EQ(offsets.count("gpuscope_test_marker"), 1u);
  EXPECT_EQ(offsets.count("no_such_function"), 0u);
  const uint64_t off = offsets["gpuscope_test_marker"];
  auto sym = elf->symbolize(off + 1);
  ASSERT_TRUE(sym);
  EXPECT_EQ(sym->first.name, "gpuscope_test_marker");
  EXPECT_EQ(sym->second, 1u);
  EXPECT_TRUE(elf->has_function("gpuscope_test_marker"));
  EXPECT_TRUE(defines_any_function("/proc/self/exe", {"gpuscope_test_marker"}));
  EXPECT_FALSE(defines_any_function("/proc/self/exe", {"cudaLaunchKernel"}));
}

TEST(ElfFile, VersionedDynamicSymbolsOfTheRealCudart) {
  if (!std::filesystem::exists(kCudart)) GTEST_SKIP() << "no CUDA toolkit";
  auto elf = ElfFile::open(kCudart);
  auto offsets = elf->function_offsets({"cudaMalloc", "cudaLaunchKernel", "cudaLaunchKernel_ptsz"});
  ASSERT_EQ(offsets.size(), 3u);  // .dynsym names carry @@libcudart.so.13
  EXPECT_NE(offsets["cudaLaunchKernel"], offsets["cudaLaunchKernel_ptsz"]);
  EXPECT_GT(offsets["cudaMalloc"], 0u);
  EXPECT_EQ(elf->build_id(), "2a12a4a442f0edf6eab8241fdeedb40019c4256c");
  EXPECT_EQ(read_build_id(kCudart), elf->build_id());
  EXPECT_TRUE(defines_any_function(kCudart, {"cudaMalloc"}));
}

TEST(ElfFile, BadFilesGiveAClearError) {
  EXPECT_THROW(ElfFile::open("/nonexistent/lib.so"), std::runtime_error);
  const auto text = std::filesystem::temp_directory_path() / "gpuscope-not-elf.txt";
  std::ofstream(text) << "not an ELF file\n";
  try {
    ElfFile::open(text.string());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not an ELF file"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(defines_any_function(text.string(), {"main"}));
  EXPECT_EQ(read_build_id(text.string()), "");
  std::filesystem::remove(text);
}

TEST(Symbolizer, DemanglesAndChecksBuildIds) {
  EXPECT_EQ(demangle("_Z6vecAddPfS_S_i"), "vecAdd(float*, float*, float*, int)");
  EXPECT_EQ(demangle("plain_c_name"), "plain_c_name");
  // nvcc's anonymous namespaces read as the compiler's demangler writes them.
  EXPECT_EQ(demangle("_ZN2at6native43_GLOBAL__N__50f1b6c4_10_Dropout_cu_0e96ed385helloEv"),
            "at::native::(anonymous namespace)::hello()");

  auto elf = ElfFile::open("/proc/self/exe");
  const uint64_t off = elf->function_offsets({"gpuscope_test_marker"})["gpuscope_test_marker"];
  Symbolizer sym;
  EXPECT_EQ(sym.resolve("/proc/self/exe", elf->build_id(), off).function, "gpuscope_test_marker");
  // A file that changed since the recording (another build id) names nothing rather than lie.
  EXPECT_EQ(sym.resolve("/proc/self/exe", "00000000", off).function, "");
  EXPECT_EQ(sym.resolve("/nonexistent", "", off).function, "");
}
