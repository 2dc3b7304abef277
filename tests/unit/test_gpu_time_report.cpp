// The report's GPU time section on hand-made records with GPU activities (what --gpu-times
// stores): busy share and idle gaps over the span each GPU was in use, start-up apart, one span
// per GPU and per process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>

#include "cuda/functions.h"
#include "report/report.h"
#include "report/sections/gpu_time.h"
#include "store/record_writer.h"

using namespace gpuscope;
using nlohmann::json;

namespace {

constexpr int64_t kStart = 5'000'000'000;  // the recording's start_ns
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;

class GpuRecord {
 public:
  explicit GpuRecord(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / fmt::format("gpuscope_gpu_{}_{}", name, getpid())).string()) {}
  ~GpuRecord() { std::filesystem::remove(path_); }

  // A recording of `length` ns whose process made a launch, for each kernel given, 10 µs before
  // it ran: (pid, gpu, start after the recording's start, duration).
  struct Kernel {
    uint32_t pid;
    int64_t gpu, start, duration;
  };
  json report(const std::vector<Kernel>& kernels, int64_t length, const std::string& mode = "command") {
    {
      store::RecordWriter w(path_);
      w.set_meta("mode", mode);
      w.set_meta("command", "python3 train.py");
      w.set_meta("start_ns", std::to_string(kStart));
      w.set_meta("end_ns", std::to_string(kStart + length));
      w.upsert_process(100, 1, "python3", "python3 train.py", "/usr/bin/python3", kStart);
      w.upsert_process(200, 100, "worker", "python3 worker.py", "/usr/bin/python3", kStart);
      int64_t id = 1;
      for (const auto& k : kernels) {
        CallEvent e;
        e.func = cuda::function_by_symbol("cudaLaunchKernel")->id;
        e.call_id = id++;
        e.ts_ns = uint64_t(kStart + k.start - 10'000);
        e.pid = e.tid = k.pid;
        w.add_call(e);
      }
      w.finish();
    }
    store::Db db(path_, store::Db::Mode::Create);
    auto ins = db.prepare(
        "INSERT INTO gpu_activities(pid, kind, gpu, stream, start_ns, end_ns, name, call_id) "
        "VALUES(?1, 'kernel', ?2, 7, ?3, ?4, 'step_kernel', ?5)");
    int64_t id = 1;
    for (const auto& k : kernels) {
      ins.bind(1, int64_t(k.pid)).bind(2, k.gpu).bind(3, kStart + k.start).bind(4, kStart + k.start + k.duration);
      ins.bind(5, id++);
      ins.step();
      ins.reset();
    }
    store::RecordReader reader(path_);
    symbolize::Symbolizer sym;
    return report::build_report(reader, sym, report::Options{});
  }

 private:
  std::string path_;
};

TEST(GpuTimeReport, BusyShareAndGapsAreOverTheSpanInUseWithStartUpApart) {
  // 7 s of imports and set-up, then 20 steps of a 1 ms kernel every 10 ms, then 2.8 s more.
  std::vector<GpuRecord::Kernel> steps;
  for (int i = 0; i < 20; ++i) steps.push_back({100, 0, 7 * kS + i * 10 * kMs, kMs});
  GpuRecord rec("span");
  const json doc = rec.report(steps, 10 * kS);
  const json& g = doc.at("gpu_time").at("gpus").at(0);
  EXPECT_EQ(g.at("busy_ns"), 20 * kMs);
  EXPECT_EQ(g.at("first_ns"), 7 * kS);
  EXPECT_EQ(g.at("last_ns"), 7 * kS + 191 * kMs);
  EXPECT_EQ(g.at("active_span_ns"), 191 * kMs);
  EXPECT_NEAR(g.at("busy_share").get<double>(), 20.0 / 191, 1e-9);  // not 20 ms of the 10 s recorded
  EXPECT_NEAR(g.at("busy_share_of_recording").get<double>(), 0.002, 1e-9);
  EXPECT_EQ(g.at("startup_ns"), 7 * kS);
  EXPECT_EQ(g.at("startup_from"), "command start");
  EXPECT_EQ(g.at("after_last_ns"), 10 * kS - 7 * kS - 191 * kMs);
  // The start-up is not an idle gap: the longest are the 9 ms between steps.
  ASSERT_EQ(g.at("longest_gaps").size(), 5u);
  for (const auto& gap : g.at("longest_gaps")) EXPECT_EQ(gap.at("duration_ns"), 9 * kMs) << gap;
  // Busy over time spans the steps, not the recording (where they would fill 1 part of 50).
  const auto& series = g.at("series");
  ASSERT_EQ(series.size(), 50u);
  EXPECT_GT(series[0].get<double>(), 0);
  EXPECT_GT(series[49].get<double>(), 0);
  int busy_parts = 0;
  for (const auto& v : series) busy_parts += v.get<double>() > 0;
  EXPECT_GE(busy_parts, 20);  // each step in a part of its own
  ASSERT_EQ(g.at("processes").size(), 1u);
  EXPECT_EQ(g.at("processes")[0].at("pid"), 100);

  const std::string text = report::render_text(doc);
  EXPECT_NE(text.find("GPU 0: busy 20.00 ms of the 191.00 ms it was in use (10.5%), 20 activities"), std::string::npos)
      << text;
  EXPECT_NE(text.find("in use from 7.00 s to 7.19 s of the recording"), std::string::npos) << text;
  EXPECT_NE(text.find("start-up: 7.00 s from the command's start to the first; 2.81 s after the last"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("9.00 ms idle from 7.00 s"), std::string::npos) << text;
  EXPECT_EQ(text.find("7.00 s idle"), std::string::npos) << text;
  EXPECT_EQ(text.find("processes on it"), std::string::npos) << text;  // one process: no list
}

TEST(GpuTimeReport, EachGpuAndEachProcessHasItsOwnSpan) {
  GpuRecord rec("several");
  const json doc = rec.report({{100, 0, 1 * kS, 500 * kMs},   // GPU 0: the trainer, early
                               {200, 0, 3 * kS, 50 * kMs},    // GPU 0: a worker, later
                               {200, 0, 3 * kS + 100 * kMs, 50 * kMs},
                               {200, 1, 5 * kS, 200 * kMs}},  // GPU 1: the worker only
                              6 * kS, "all");
  const json& gpus = doc.at("gpu_time").at("gpus");
  ASSERT_EQ(gpus.size(), 2u);
  const json &g0 = gpus[0], &g1 = gpus[1];
  EXPECT_EQ(g0.at("first_ns"), 1 * kS);
  EXPECT_EQ(g0.at("active_span_ns"), 2150 * kMs);
  EXPECT_NEAR(g0.at("busy_share").get<double>(), 600.0 / 2150, 1e-9);
  EXPECT_EQ(g0.at("startup_from"), "recording start");  // --all: the processes ran before
  // The GPU idle between one process's work and the other's is a gap in its span.
  EXPECT_EQ(g0.at("longest_gaps")[0].at("duration_ns"), 1500 * kMs);
  EXPECT_EQ(g0.at("longest_gaps")[0].at("start_ns"), 1500 * kMs);
  ASSERT_EQ(g0.at("processes").size(), 2u);
  const json &trainer = g0.at("processes")[0], &worker = g0.at("processes")[1];
  EXPECT_EQ(trainer.at("pid"), 100);
  EXPECT_EQ(trainer.at("comm"), "python3");
  EXPECT_EQ(trainer.at("active_span_ns"), 500 * kMs);
  EXPECT_EQ(trainer.at("busy_share"), 1.0);
  EXPECT_EQ(worker.at("pid"), 200);
  EXPECT_EQ(worker.at("first_ns"), 3 * kS);
  EXPECT_EQ(worker.at("active_span_ns"), 150 * kMs);
  EXPECT_NEAR(worker.at("busy_share").get<double>(), 100.0 / 150, 1e-9);
  EXPECT_EQ(worker.at("activities"), 2);

  EXPECT_EQ(g1.at("gpu"), 1);
  EXPECT_EQ(g1.at("startup_ns"), 5 * kS);
  EXPECT_EQ(g1.at("active_span_ns"), 200 * kMs);
  EXPECT_EQ(g1.at("busy_share"), 1.0);
  EXPECT_EQ(g1.at("after_last_ns"), 800 * kMs);
  EXPECT_TRUE(g1.at("longest_gaps").empty());

  const std::string text = report::render_text(doc);
  EXPECT_NE(text.find("start-up: 1.00 s from the recording's start to the first"), std::string::npos) << text;
  EXPECT_NE(text.find("processes on it, each over its own span in use:\n"
                      "      PID 100 python3: busy 500.00 ms of 500.00 ms (100.0%), from 1.00 s to 1.50 s, 1 "
                      "activities\n"
                      "      PID 200 worker: busy 100.00 ms of 150.00 ms (66.7%), from 3.00 s to 3.15 s, 2 activities\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("GPU 1: busy 200.00 ms of the 200.00 ms it was in use (100.0%)"), std::string::npos) << text;
}

TEST(GpuTimeReport, BusyStretchesAreTheUnionOfIntervals) {
  using report::Interval;
  const auto busy = report::busy_stretches({{50, 60}, {0, 10}, {5, 20}, {20, 30}, {40, 45}, {41, 42}});
  ASSERT_EQ(busy.size(), 3u);
  EXPECT_EQ(busy[0].start, 0);
  EXPECT_EQ(busy[0].end, 30);
  EXPECT_EQ(busy[1].start, 40);
  EXPECT_EQ(busy[1].end, 45);
  EXPECT_EQ(busy[2].start, 50);
  EXPECT_EQ(busy[2].end, 60);
}

}  // namespace
