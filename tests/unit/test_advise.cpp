// advise on crafted records: copies that succeeded are priced by their own times, without the wait
// for earlier work that a copy's call also holds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>

#include "advise/advise.h"
#include "cuda/functions.h"
#include "store/record_reader.h"
#include "store/record_writer.h"
#include "symbolize/symbolizer.h"

using namespace gpuscope;

namespace {

constexpr uint32_t kPid = 100;
constexpr uint64_t kBuffer = 0x7f0000000000, kDevice = 0x700000000000;

// `n` copies of 16 MB from one pageable buffer to the GPU, each call `call_ns` long; the advice.
nlohmann::json advised(const char* name, int n, uint64_t call_ns) {
  const auto path = std::filesystem::temp_directory_path() / fmt::format("gpuscope_advise_{}_{}", name, getpid());
  {
    store::RecordWriter w(path.string());
    w.set_meta("start_ns", "0");
    w.upsert_process(kPid, 1, "train", "train", "/usr/bin/train", 0);
    for (int i = 0; i < n; ++i) {
      CallEvent e;
      e.call_id = i + 1;
      e.func = cuda::function_by_symbol("cudaMemcpy")->id;
      e.pid = e.tid = kPid;
      e.ts_ns = 1'000'000 + uint64_t(i) * 100'000'000;
      e.duration_ns = call_ns;
      e.has_return = true;
      e.ptr = kDevice;
      e.src = kBuffer;
      e.bytes = 16 << 20;
      e.dir = cuda::CopyDir::HostToDevice;
      e.host_mem = HostMem::Pageable;
      w.add_call(e);
    }
    w.finish();
  }
  nlohmann::json doc;
  {
    store::RecordReader reader(path.string());
    symbolize::Symbolizer sym;
    report::CallSites sites(reader.db(), sym);
    doc = advise::advise(reader, sites, advise::builtin_copy_model(), {});
  }
  std::filesystem::remove(path);
  return doc;
}

}  // namespace

TEST(Advise, ACopysOwnTimeIsTakenUpToOneAndAHalfTimesTheModels) {
  // 10 copies of 16 MB (1.33 ms each in the model) whose calls took 50 ms, waiting for the GPU's
  // earlier work: each counts 1.5x the model's time, not 50 ms.
  const auto doc = advised("waiting", 10, 50'000'000);
  ASSERT_EQ(doc["sites"].size(), 1u);
  const auto& s = doc["sites"][0];
  EXPECT_EQ(s["time_from"], "measured");
  EXPECT_NEAR(s["time_ms"].get<double>(), 10 * 1.5 * 1.3275, 0.01);
  EXPECT_EQ(s["action"], "pin");
  EXPECT_EQ(s["buffers"], 1);
}

TEST(Advise, CopiesFasterThanTheModelKeepTheirOwnTimes) {
  const auto doc = advised("fast", 10, 1'000'000);
  ASSERT_EQ(doc["sites"].size(), 1u);
  EXPECT_NEAR(doc["sites"][0]["time_ms"].get<double>(), 10.0, 1e-6);
  EXPECT_EQ(doc["sites"][0]["time_from"], "measured");
}
