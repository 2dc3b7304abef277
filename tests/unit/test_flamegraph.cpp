// Flame graph data from a small hand-made record: exact weights per stack for the memory metrics
// (the runtime tests cannot make allocations succeed without a GPU), and the output encodings.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "cuda/functions.h"
#include "report/flamegraph.h"
#include "store/record_writer.h"
#include "symbolize/kallsyms.h"

using namespace gpuscope;

namespace {

constexpr uint32_t kPid = 7;
constexpr int64_t kMiB = 1 << 20;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("gpuscope_flame_{}_{}", name, getpid())).string();
}

class FlameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = temp_path("record");
    store::RecordWriter w(path_);
    w.set_meta("start_ns", "0");
    w.set_meta("cpu_profile_hz", "100");
    w.upsert_process(kPid, 1, "app", "./app", "/app", 0);
    // Frames named at record time (as kernel frames are): module [kernel] with named offsets.
    const int64_t k = w.intern_module("[kernel]", "test");
    for (auto [off, name] : {std::pair{1, "main"}, {2, "site_a"}, {3, "site_b"}, {4, "do;semi"}}) w.add_symbol(k, off, name);
    site_a_ = w.intern_stack({{k, 2, 2}, {k, 1, 1}});  // innermost first
    site_b_ = w.intern_stack({{k, 3, 3}, {k, 1, 1}});
    odd_ = w.intern_stack({{k, 4, 4}, {k, 1, 1}});

    int64_t id = 1;
    auto call = [&](std::string_view fn, uint64_t ptr, uint64_t bytes, int64_t stack, int64_t ret = 0,
                    int64_t parent = 0) {
      CallEvent e;
      e.func = cuda::function_by_symbol(fn)->id;
      e.call_id = id++;
      e.ts_ns = uint64_t(e.call_id) * 1000;
      e.pid = e.tid = kPid;
      e.has_return = true;
      e.ret = ret;
      e.ptr = ptr;
      e.bytes = bytes;
      e.stack_id = stack;
      e.parent_id = parent;
      w.add_call(e);
      return e.call_id;
    };
    call("cudaMalloc", 0xa000, kMiB, site_a_);              // A
    const int64_t b = call("cudaMalloc", 0xb000, 2 * kMiB, site_b_);  // B: peak 3 MiB after it
    call("cuMemAlloc_v2", 0xb000, 2 * kMiB, site_b_, 0, b);  // the driver call inside B: not counted again
    call("cudaMalloc", 0, 64 * kMiB, site_a_, 2);           // failed: not counted
    call("cudaFree", 0xa000, 0, site_a_);                   // A freed
    call("cudaMalloc", 0xc000, kMiB / 2, site_a_);          // C
    w.add_sample(10, kPid, kPid, 0, site_a_, 0);
    w.add_sample(20, kPid, kPid, 0, site_a_, 0);
    w.add_sample(30, kPid, kPid, 1, odd_, 0);
    w.finish();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  report::FlameData flame(report::Metric m, bool peak = false) {
    store::RecordReader reader(path_);
    symbolize::Symbolizer sym;
    report::FlameOptions opt;
    opt.metric = m;
    opt.inuse_at_peak = peak;
    return report::build_flame(reader, sym, opt);
  }

  using Stacks = std::map<std::vector<std::string>, int64_t>;
  std::string path_;
  int64_t site_a_ = 0, site_b_ = 0, odd_ = 0;
};

TEST_F(FlameTest, AllocatedBytesCountSuccessfulTopLevelAllocations) {
  const auto d = flame(report::Metric::AllocBytes);
  EXPECT_EQ(d.stacks, (Stacks{{{"app (7)", "main_[k]", "site_a_[k]", "cudaMalloc"}, kMiB + kMiB / 2},
                              {{"app (7)", "main_[k]", "site_b_[k]", "cudaMalloc"}, 2 * kMiB}}));
  EXPECT_EQ(d.sample_type, "alloc_space");
  EXPECT_EQ(d.unit, "bytes");
}

TEST_F(FlameTest, InUseBytesAtTheEndAndAtThePeak) {
  EXPECT_EQ(flame(report::Metric::InuseBytes).stacks,
            (Stacks{{{"app (7)", "main_[k]", "site_a_[k]", "cudaMalloc"}, kMiB / 2},
                    {{"app (7)", "main_[k]", "site_b_[k]", "cudaMalloc"}, 2 * kMiB}}));
  EXPECT_EQ(flame(report::Metric::InuseBytes, true).stacks,
            (Stacks{{{"app (7)", "main_[k]", "site_a_[k]", "cudaMalloc"}, kMiB},
                    {{"app (7)", "main_[k]", "site_b_[k]", "cudaMalloc"}, 2 * kMiB}}));
}

TEST_F(FlameTest, CpuSamplesWeighOnePeriodEach) {
  const auto d = flame(report::Metric::Cpu);
  EXPECT_EQ(d.period, 10'000'000);
  EXPECT_EQ(d.total(), 30'000'000);
  // Frame names cannot break the folded format: ';' separates frames.
  EXPECT_NE(report::to_folded(d).find("app (7);main_[k];do:semi_[k] 10000000\n"), std::string::npos);
}

TEST_F(FlameTest, NothingToWeighIsAnError) {
  EXPECT_THROW(flame(report::Metric::Launches), Error);
}

TEST_F(FlameTest, PprofIsGzippedProtobufWithTheNames) {
  const std::string gz = report::to_pprof(flame(report::Metric::Cpu));
  ASSERT_GT(gz.size(), 2u);
  EXPECT_EQ(uint8_t(gz[0]), 0x1f);  // gzip magic
  EXPECT_EQ(uint8_t(gz[1]), 0x8b);
  std::string raw(1 << 16, '\0');
  z_stream z{};
  ASSERT_EQ(inflateInit2(&z, 15 + 16), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = uInt(gz.size());
  z.next_out = reinterpret_cast<Bytef*>(raw.data());
  z.avail_out = uInt(raw.size());
  ASSERT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
  raw.resize(z.total_out);
  inflateEnd(&z);
  EXPECT_EQ(raw[0], 0x0a);  // field 1 (sample_type), length-delimited
  for (const char* s : {"cpu", "nanoseconds", "main_[k]", "site_a_[k]", "app (7)"})
    EXPECT_NE(raw.find(s), std::string::npos) << s;
}

TEST_F(FlameTest, HtmlIsOneFileWithTheDataInline) {
  const std::string html = report::to_html(flame(report::Metric::Cpu), "cpu: </script> & <b>");
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_NE(html.find("&lt;/script&gt; &amp; &lt;b&gt;"), std::string::npos);  // escaped in <title>
  EXPECT_EQ(html.find("</script> &"), std::string::npos);                      // and in the data
  EXPECT_NE(html.find("site_a_[k]"), std::string::npos);
}

TEST(FlameFormat, ChosenByExtension) {
  EXPECT_EQ(report::format_for_path("a.html"), report::FlameFormat::Html);
  EXPECT_EQ(report::format_for_path("a.folded"), report::FlameFormat::Folded);
  EXPECT_EQ(report::format_for_path("-"), report::FlameFormat::Folded);
  EXPECT_EQ(report::format_for_path("cpu.pb.gz"), report::FlameFormat::Pprof);
  EXPECT_THROW(report::format_for_path("a.png"), Error);
  EXPECT_THROW(report::parse_metric("gpu-seconds"), Error);
  EXPECT_EQ(report::parse_metric("gpu-time"), report::Metric::GpuTime);
  EXPECT_EQ(report::parse_metric("inuse-bytes"), report::Metric::InuseBytes);
}

TEST(Kallsyms, FunctionsOnlyNamedByTheSymbolBelow) {
  const std::string path = temp_path("kallsyms");
  std::ofstream(path) << "ffffffff81000000 T _stext\n"
                         "ffffffff81000100 t helper\n"
                         "ffffffff81000200 D some_data\n"
                         "ffffffffc0001000 t nv_open\t[nvidia]\n"
                         "0000000000000000 T hidden\n";
  symbolize::Kallsyms k(path);
  EXPECT_EQ(k.size(), 3u);
  EXPECT_EQ(k.resolve(0xffffffff81000150), "helper");
  EXPECT_EQ(k.resolve(0xffffffff81000250), "helper");  // data symbols do not end a function here
  EXPECT_EQ(k.resolve(0xffffffffc0001004), "nv_open [nvidia]");
  EXPECT_EQ(k.resolve(0x1000), "");
  std::filesystem::remove(path);
}

}  // namespace
