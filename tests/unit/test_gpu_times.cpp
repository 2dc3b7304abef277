// GPU times: reading the injection library's trace files, and tying activities to recorded calls.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "gpu/gpu_times.h"

using namespace gpuscope::gpu;

namespace {

gs_gpu_record api(uint32_t corr, uint64_t start, uint64_t end, uint32_t thread, uint16_t driver = 0) {
  gs_gpu_record r{};
  r.kind = GS_GPU_API;
  r.detail = driver;
  r.correlation = corr;
  r.start = start;
  r.end = end;
  r.thread = thread;
  return r;
}

gs_gpu_record activity(uint16_t kind, uint32_t corr, uint64_t start, uint64_t end) {
  gs_gpu_record r{};
  r.kind = kind;
  r.correlation = corr;
  r.start = start;
  r.end = end;
  return r;
}

GpuTrace trace_of(std::vector<gs_gpu_record> records) {
  GpuTrace t;
  t.records = std::move(records);
  t.names.resize(t.records.size());
  return t;
}

std::string temp_path() {
  char tmpl[] = "/tmp/gpuscope-gpu-test-XXXXXX";
  int fd = mkstemp(tmpl);
  close(fd);
  return tmpl;
}

}  // namespace

TEST(GpuTimes, KernelsFindTheLaunchInsideTheirApiCall) {
  // Thread 7 launches twice (gpuscope saw the driver launches, inside CUPTI's runtime records),
  // and mallocs in between; thread 8 launches at the same time as the second launch.
  std::vector<RecordedCall> calls = {
      {1, 7, 1'000, 0, "launch"}, {2, 7, 5'000, 2'000, "alloc"}, {3, 7, 10'000, 0, "launch"},
      {4, 8, 10'050, 0, "launch"}, {5, 7, 20'000, 500, "memcpy"}};
  auto t = trace_of({api(100, 900, 1'500, 7), api(101, 9'950, 10'400, 7), api(102, 10'000, 10'500, 8),
                     api(103, 19'990, 20'600, 7), activity(GS_GPU_KERNEL, 100, 30'000, 31'000),
                     activity(GS_GPU_KERNEL, 101, 32'000, 33'000), activity(GS_GPU_KERNEL, 102, 34'000, 35'000),
                     activity(GS_GPU_MEMCPY, 103, 40'000, 41'000), activity(GS_GPU_KERNEL, 999, 50'000, 51'000)});
  const auto ids = correlate(t, calls);
  ASSERT_EQ(ids.size(), t.records.size());
  EXPECT_EQ(ids[4], 1);
  EXPECT_EQ(ids[5], 3);  // thread 7's launch, not thread 8's nearer one
  EXPECT_EQ(ids[6], 4);
  EXPECT_EQ(ids[7], 5);
  EXPECT_EQ(ids[8], 0);  // no API record with its correlation id
  EXPECT_EQ(ids[0], 0);  // API records themselves are not tied
}

TEST(GpuTimes, WithoutUsableThreadIdsTimeAlonePicksTheCall) {
  // CUPTI's thread ids that match no recorded tid: the nearest call of the right kind wins.
  std::vector<RecordedCall> calls = {{1, 7, 1'000, 0, "launch"}, {2, 7, 1'200, 300, "alloc"}};
  auto t = trace_of({api(5, 1'100, 1'600, 123456789), activity(GS_GPU_KERNEL, 5, 2'000, 3'000)});
  EXPECT_EQ(correlate(t, calls)[1], 1);
}

TEST(GpuTimes, GraphNodesFindTheirGraphLaunch) {
  // XLA (JAX) runs its steps as CUDA graphs: each node's kernel or copy names the graph launch's
  // correlation id, and is tied to that cuGraphLaunch call; a plain launch beside it keeps its own.
  std::vector<RecordedCall> calls = {{1, 7, 1'000, 0, "graph_launch"}, {2, 7, 3'000, 0, "launch"}};
  auto t = trace_of({api(40, 950, 1'400, 7, 1), api(41, 2'950, 3'300, 7, 1),
                     activity(GS_GPU_KERNEL, 40, 5'000, 6'000), activity(GS_GPU_KERNEL, 40, 6'000, 7'000),
                     activity(GS_GPU_MEMCPY, 40, 7'000, 7'500), activity(GS_GPU_KERNEL, 41, 8'000, 9'000)});
  const auto ids = correlate(t, calls);
  EXPECT_EQ(ids[2], 1);
  EXPECT_EQ(ids[3], 1);
  EXPECT_EQ(ids[4], 1);
  EXPECT_EQ(ids[5], 2);
}

TEST(GpuTimes, ReadsTraceFilesAndStopsAtATruncatedRecord) {
  const std::string path = temp_path();
  {
    std::ofstream out(path, std::ios::binary);
    gs_gpu_trace_header h{};
    std::memcpy(h.magic, GS_GPU_TRACE_MAGIC, sizeof(h.magic));
    h.pid = 42;
    h.clock_offset_ns = 1'000;  // CUPTI's own clock: shifted onto CLOCK_MONOTONIC when read
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    auto k = activity(GS_GPU_KERNEL, 1, 10, 20);
    const std::string name = "_Z6vecAddPKfS0_Pfi";
    k.name_len = uint32_t(name.size());
    out.write(reinterpret_cast<const char*>(&k), sizeof(k));
    out << name;
    gs_gpu_record d{};
    d.kind = GS_GPU_DROPPED;
    d.bytes = 3;
    out.write(reinterpret_cast<const char*>(&d), sizeof(d));
    auto m = activity(GS_GPU_MEMCPY, 2, 30, 40);
    out.write(reinterpret_cast<const char*>(&m), sizeof(m) / 2);  // the program was killed mid-write
  }
  const auto t = read_gpu_trace(path);
  EXPECT_EQ(t.header.pid, 42u);
  ASSERT_EQ(t.records.size(), 1u);
  EXPECT_EQ(t.records[0].start, 1'010u);
  EXPECT_EQ(t.records[0].end, 1'020u);
  EXPECT_EQ(t.names[0], "_Z6vecAddPKfS0_Pfi");
  EXPECT_EQ(t.dropped, 3u);
  EXPECT_TRUE(t.truncated);

  std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a trace at all, but long enough to read";
  EXPECT_THROW(read_gpu_trace(path), std::runtime_error);
  unlink(path.c_str());
}
