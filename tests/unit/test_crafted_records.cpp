// Records made to hurt the readers (issue 30): what a crafted record holds must not crash a view,
// overflow a sum or blow up an output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <sstream>

#include "cuda/functions.h"
#include "report/flamegraph.h"
#include "report/report.h"
#include "report/timeline.h"
#include "store/record_reader.h"
#include "store/record_writer.h"
#include "symbolize/symbolizer.h"

using namespace gpuscope;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("gpuscope_crafted_{}_{}", name, getpid())).string();
}

CallEvent call(std::string_view fn, int64_t id, uint64_t bytes = 0, int64_t stack = 0) {
  CallEvent e;
  e.func = cuda::function_by_symbol(fn)->id;
  e.call_id = id;
  e.ts_ns = uint64_t(id) * 1000;
  e.pid = e.tid = 7;
  e.has_return = true;
  e.bytes = bytes;
  e.bytes_known = true;
  e.stack_id = stack;
  return e;
}

}  // namespace

TEST(CraftedRecord, AThirtyThousandFrameStackIsDrawnCutNotOverflowed) {
  const std::string path = temp_path("deep");
  {
    store::RecordWriter w(path);
    w.set_meta("start_ns", "0");
    w.upsert_process(7, 1, "app", "./app", "/app", 0);
    const int64_t k = w.intern_module("[kernel]", "test");
    w.add_symbol(k, 1, "f");
    std::vector<store::StoredFrame> frames(30000, store::StoredFrame{k, 1, 1});
    const int64_t stack = w.intern_stack(frames);
    CallEvent alloc = call("cudaMalloc", 1, 4096, stack);
    alloc.ptr = 0xa000;  // allocated
    w.add_call(alloc);
    w.finish();
  }
  store::RecordReader reader(path);
  symbolize::Symbolizer sym;
  report::FlameOptions opt;
  opt.metric = report::Metric::AllocBytes;
  const auto d = report::build_flame(reader, sym, opt);
  const std::string html = report::to_html(d, "deep");
  EXPECT_NE(html.find("deeper frames]"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(CraftedRecord, HugeValuesAndNamesNeitherOverflowNorBlowUp) {
  const std::string path = temp_path("huge");
  {
    store::RecordWriter w(path);
    w.set_meta("start_ns", "0");
    w.upsert_process(7, 1, "app", "./app", "/app", 0);
    // Two copies whose bytes sum past INT64_MAX ("record file: integer overflow" in the report).
    w.add_call(call("cudaMemcpy", 1, uint64_t(INT64_MAX) - 10));
    w.add_call(call("cudaMemcpy", 2, uint64_t(INT64_MAX) - 10));
    // A 1 MB kernel name on 200 launches: an 800 MB timeline once.
    const std::string name(1 << 20, 'k');
    const int64_t kernel = w.intern_kernel(name, name);
    for (int64_t i = 0; i < 200; ++i) {
      CallEvent e = call("cudaLaunchKernel", 10 + i);
      e.kernel_id = kernel;
      w.add_call(e);
    }
    w.finish();
  }
  store::RecordReader reader(path);
  symbolize::Symbolizer sym;
  EXPECT_NO_THROW(report::build_report(reader, sym, report::Options{}));
  report::FlameOptions opt;
  opt.metric = report::Metric::MemcpyBytes;
  EXPECT_EQ(report::build_flame(reader, sym, opt).total(), INT64_MAX);
  std::ostringstream out;
  report::write_timeline(reader, sym, report::TimelineOptions{}, out);
  EXPECT_LT(out.str().size(), 2u << 20) << "a name repeated in full in every event";
  EXPECT_NE(out.str().find("(1048576 bytes)"), std::string::npos);
  std::filesystem::remove(path);
}
