// advise's copy model: copy times between the sizes measured, beyond them, and copy_table's
// output read back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "advise/copy_model.h"
#include "common/error.h"

using namespace gpuscope;

TEST(CopyModel, MeasuredSizesAreTheirOwnTimes) {
  const auto m = advise::builtin_copy_model();
  EXPECT_NEAR(m.copy_us(1 << 20, true, false), 95.3, 1e-6);
  EXPECT_NEAR(m.copy_us(1 << 20, true, true), 28.2, 1e-6);
  EXPECT_NEAR(m.copy_us(1 << 20, false, false), 139.8, 1e-6);
  EXPECT_NEAR(m.register_us(16 << 20), 1467.8, 1e-6);
}

TEST(CopyModel, SizesBetweenAreInterpolatedAndBeyondScaleWithTheBytes) {
  const auto m = advise::builtin_copy_model();
  const double mid = m.copy_us(2 << 20, true, true);  // between 1 MB (28.2) and 4 MB (87.7)
  EXPECT_GT(mid, 28.2);
  EXPECT_LT(mid, 87.7);
  // Twice the largest size: twice its time; below the smallest: the smallest's (a copy's latency).
  EXPECT_NEAR(m.copy_us(2.0 * (1 << 30), true, true), 2 * 20698.2, 1e-3);
  EXPECT_NEAR(m.copy_us(512, true, true), 8.6, 1e-6);
  EXPECT_EQ(m.copy_us(0, true, true), 0);
}

TEST(CopyModel, PinnedIsFasterFromTensOfKilobytesAndSlowerAtAPage) {
  const auto m = advise::builtin_copy_model();
  EXPECT_GT(m.copy_us(4096, true, true), m.copy_us(4096, true, false));
  for (double bytes : {64e3, 1e6, 16e6, 256e6, 4e9}) EXPECT_LT(m.copy_us(bytes, true, true), m.copy_us(bytes, true, false));
}

TEST(CopyModel, CopyTablesOutputIsReadBack) {
  const auto path = std::filesystem::temp_directory_path() / ("gpuscope_copy_table_" + std::to_string(getpid()));
  {
    std::ofstream f(path);
    f << "# NVIDIA H100; times in us (median); GB/s = bytes / time\n"
         "     bytes   dir pageable_us   pinned_us register_us  pageGB/s   pinGB/s   regGB/s\n"
         "   1048576   H2D        90.0        30.0        31.0     11.65     34.95     33.83\n"
         "   1048576   D2H       120.0        29.0        29.5      8.74     36.16     35.54\n"
         "   1048576  reg: touched 600.0 us, untouched 900.0 us; unregister 200.0 us\n"
         "  16777216   H2D      1600.0       320.0       321.0     10.49     52.43     52.27\n"
         "  16777216   D2H      1700.0       310.0       311.0      9.87     54.12     53.95\n"
         "  16777216  reg: touched 2000.0 us, untouched 9000.0 us; unregister 500.0 us\n"
         "real\t0m8.552s\n";
  }
  const auto m = advise::load_copy_model(path);
  std::filesystem::remove(path);
  ASSERT_EQ(m.rows.size(), 2u);
  EXPECT_NEAR(m.copy_us(1 << 20, true, false), 90.0, 1e-6);
  EXPECT_NEAR(m.copy_us(16 << 20, false, true), 310.0, 1e-6);
  EXPECT_NEAR(m.register_us(1 << 20), 600.0, 1e-6);
  EXPECT_NEAR(m.unregister_us(16 << 20), 500.0, 1e-6);
}

TEST(CopyModel, AFileThatIsNoCopyTableIsRefusedWithWhatToDo) {
  const auto path = std::filesystem::temp_directory_path() / ("gpuscope_not_a_table_" + std::to_string(getpid()));
  {
    std::ofstream f(path);
    f << "hello\n   1048576   H2D 90 30 31\n";
  }
  try {
    advise::load_copy_model(path);
    FAIL() << "a table without complete sizes was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("build/bench/copy_table > FILE"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(advise::load_copy_model("/nonexistent/table"), Error);
}
