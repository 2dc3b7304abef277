// The report built from a small hand-made record file: exact numbers in the JSON, key lines in the text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <map>

#include "report/cuda_errors.h"
#include "report/report.h"
#include "store/record_writer.h"
#include "symbolize/debug_info.h"
#include "elf/elf_file.h"

using namespace gpuscope;
using nlohmann::json;

// Functions of this binary that the test's stacks point at, named when symbolised.
extern "C" __attribute__((noinline)) void gs_report_test_site_a() { asm volatile(""); }
constexpr int kSiteALine = __LINE__ - 1;
extern "C" __attribute__((noinline)) void gs_report_test_site_b() { asm volatile(""); }
constexpr int kSiteBLine = __LINE__ - 1;
// Named like the kernel below (_Z6vecaddPfi), as nvcc names a kernel's host stub.
__attribute__((noinline)) void vecadd(float*, int) { asm volatile(""); }

namespace {

// A frame's text, with its source line when this test binary carries DWARF (built with -g).
std::string site(const std::string& text, int line) {
  static const bool has_lines = symbolize::DebugInfo::open("/proc/self/exe") != nullptr;
  return has_lines ? fmt::format("{} at test_report.cpp:{}", text, line) : text;
}

constexpr int64_t kStart = 1'000'000'000;  // the recording's start_ns
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kMiB = 1 << 20;
constexpr uint32_t kPid = 100;

std::string temp_record(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("gpuscope_test_{}_{}.record", name, getpid())).string();
}

class Recording {
 public:
  // A recording killed before its end has no end_ns.
  explicit Recording(const std::string& path, bool ended = true) : w(path) {
    w.keep();  // under way: a writer gone without finish() leaves what it wrote
    w.set_meta("mode", "command");
    w.set_meta("command", "./app --size 10");
    w.set_meta("host", "testhost");
    w.set_meta("start_ns", std::to_string(kStart));
    if (ended) w.set_meta("end_ns", std::to_string(kStart + 2000 * kMs));
  }

  // A call at t_ms after the start; launches carry no return, as their probes have none.
  CallEvent call(std::string_view symbol, int64_t t_ms, int64_t ret = 0, int64_t duration_ns = 1000) {
    const auto* f = cuda::function_by_symbol(symbol);
    EXPECT_NE(f, nullptr) << symbol;
    CallEvent e;
    e.func = f->id;
    e.ts_ns = uint64_t(kStart + t_ms * kMs);
    e.pid = kPid;
    e.tid = kPid;
    e.has_return = f->has_return;
    if (e.has_return) {
      e.ret = ret;
      e.duration_ns = uint64_t(duration_ns);
    }
    return e;
  }
  int64_t add(CallEvent e, int64_t parent = 0) {
    e.call_id = next_id_++;
    e.parent_id = parent;
    w.add_call(e);
    return e.call_id;
  }

  store::RecordWriter w;

 private:
  int64_t next_id_ = 1;
};

json build(const std::string& path) {
  store::RecordReader reader(path);
  symbolize::Symbolizer sym;
  return report::build_report(reader, sym, report::Options{});
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = temp_record("report");
    Recording r(path_);
    auto& w = r.w;
    w.upsert_process(kPid, 1, "app", "./app --size 10", "/app", kStart);
    w.set_process_exit(kPid, kStart + 1500 * kMs, 0);
    w.add_library({kPid, "/usr/lib/x86_64-linux-gnu/libcudart.so.13", "aa", 54, 0, kStart, ""});
    w.add_library({kPid, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "bb", 0, 0, kStart, "no symbols"});

    auto exe = elf::ElfFile::open("/proc/self/exe");
    auto off = exe->function_offsets({"gs_report_test_site_a", "gs_report_test_site_b", "_Z6vecaddPfi"});
    ASSERT_EQ(off.size(), 3u);
    const int64_t me = w.intern_module("/proc/self/exe", exe->build_id());
    // Not on this machine: its frames symbolise to nothing, but are known to be CUDA's.
    const int64_t cudart = w.intern_module("/usr/lib/x86_64-linux-gnu/libcudart.so.13", "");
    const int64_t cuda = w.intern_module("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "");
    const store::StoredFrame in_cudart{cudart, 0x1000, 1}, in_cuda{cuda, 0x2000, 2},
        site_a{me, off["gs_report_test_site_a"], 3}, site_b{me, off["gs_report_test_site_b"], 4},
        stub{me, off["_Z6vecaddPfi"], 5}, anonymous{0, 0, 0xdeadbeef};
    const int64_t launch_a = w.intern_stack({in_cudart, stub, site_a});
    const int64_t launch_b = w.intern_stack({in_cudart, stub, site_b});
    const int64_t driver_launch = w.intern_stack({in_cuda, in_cudart, stub, site_a});
    const int64_t alloc_freed = w.intern_stack({in_cudart, site_a});
    const int64_t alloc_leaked = w.intern_stack({in_cudart, site_b, anonymous});

    // Kernels: 3 + 1 runtime launches of vecadd, each also seen as a nested driver launch,
    // and one unnamed driver launch.
    const int64_t vecadd_id = w.intern_kernel("_Z6vecaddPfi", "vecadd(float*, int)");
    auto launch = [&](std::string_view fn, int64_t t, uint32_t grid, int64_t stack, int64_t kernel, uint64_t handle) {
      auto e = r.call(fn, t);
      e.grid[0] = grid;
      e.grid[1] = e.grid[2] = 1;
      e.block[0] = 256;
      e.block[1] = e.block[2] = 1;
      e.stack_id = stack;
      e.kernel_id = kernel;
      e.kernel_handle = handle;
      return e;
    };
    for (int i = 0; i < 4; ++i) {
      const uint32_t grid = i < 3 ? 128 : 64;
      const int64_t id =
          r.add(launch("cudaLaunchKernel", 800 + i, grid, i < 3 ? launch_a : launch_b, vecadd_id, 0x401000));
      r.add(launch("cuLaunchKernel", 800 + i, grid, driver_launch, vecadd_id, 0x55000), id);
    }
    auto unnamed = launch("cuLaunchKernel", 810, 1, 0, 0, 0xabc0);
    unnamed.block[0] = 32;
    r.add(unnamed);

    // Copies.
    auto copy = [&](int64_t t, cuda::CopyDir dir, HostMem mem, uint64_t bytes, int64_t dur_us, int64_t ret = 0) {
      auto e = r.call("cudaMemcpy", t, ret, dur_us * 1000);
      e.dir = dir;
      e.host_mem = mem;
      e.bytes = bytes;
      return r.add(e);
    };
    const int64_t pinned_copy = copy(900, cuda::CopyDir::HostToDevice, HostMem::Pinned, kMiB, 100);
    auto inner = r.call("cuMemcpyHtoD_v2", 900, 0, 90'000);
    inner.dir = cuda::CopyDir::HostToDevice;
    inner.host_mem = HostMem::Pinned;
    inner.bytes = kMiB;
    r.add(inner, pinned_copy);
    copy(901, cuda::CopyDir::HostToDevice, HostMem::Pageable, 2 * kMiB, 300);
    copy(902, cuda::CopyDir::HostToDevice, HostMem::Pageable, 2 * kMiB, 500);
    copy(903, cuda::CopyDir::HostToDevice, HostMem::Pageable, 16, 5, 1);
    copy(904, cuda::CopyDir::DeviceToHost, HostMem::Pageable, 4096, 50);
    copy(905, cuda::CopyDir::DeviceToDevice, HostMem::NotApplicable, 8 * kMiB, 10);

    // Memory: the same address allocated twice, a leak, pinned memory, failures.
    auto mem = [&](std::string_view fn, int64_t t, uint64_t ptr, uint64_t bytes, int64_t stack, int64_t ret = 0) {
      auto e = r.call(fn, t, ret);
      e.ptr = ptr;
      e.bytes = bytes;
      e.stack_id = stack;
      return e;
    };
    constexpr uint64_t kReused = 0x7f0000000000, kLeaked = 0x7f0000200000, kPinned = 0x500000;
    r.add(mem("cudaMalloc", 100, 0, 64, alloc_freed, 35));
    const int64_t first = r.add(mem("cudaMalloc", 200, kReused, kMiB, alloc_freed));
    r.add(mem("cuMemAlloc_v2", 200, kReused, kMiB, 0), first);
    r.add(mem("cudaMallocHost", 250, kPinned, 64 * 1024, alloc_freed));
    r.add(mem("cudaFree", 300, kReused, 0, alloc_freed));
    r.add(mem("cudaFreeHost", 350, kPinned, 0, alloc_freed));
    r.add(mem("cudaMalloc", 400, kReused, 4 * kMiB, alloc_freed));
    r.add(mem("cudaMalloc", 500, kLeaked, 256 * 1024, alloc_leaked));
    r.add(mem("cudaFree", 600, kReused, 0, alloc_freed));
    const int64_t failed = r.add(mem("cudaMalloc", 700, 0, 64 * kMiB, alloc_freed, 2));
    r.add(mem("cuMemAlloc_v2", 700, 0, 64 * kMiB, 0, 2), failed);

    // Synchronisation.
    const int64_t sync = r.add(r.call("cudaDeviceSynchronize", 1000, 0, 1 * kMs));
    r.add(r.call("cuCtxSynchronize", 1000, 0, kMs - 1000), sync);
    r.add(r.call("cudaDeviceSynchronize", 1100, 0, 3 * kMs));
    r.add(r.call("cudaStreamSynchronize", 1200, 0, 500'000));

    w.set_lost("ringbuf_full", 0);
    w.set_lost("stack", 3);
    w.set_lost("queue_full", 2);
    w.finish();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string path_;
};

TEST(CudaErrors, NamesRuntimeAndDriverCodes) {
  EXPECT_EQ(report::cuda_error_name(0, cuda::Api::Runtime), "cudaSuccess");
  EXPECT_EQ(report::cuda_error_name(35, cuda::Api::Runtime), "cudaErrorInsufficientDriver");
  EXPECT_EQ(report::cuda_error_name(719, cuda::Api::Runtime), "cudaErrorLaunchFailure");
  EXPECT_EQ(report::cuda_error_name(2, cuda::Api::Driver), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(report::cuda_error_name(999, cuda::Api::Driver), "CUDA_ERROR_UNKNOWN");
  EXPECT_EQ(report::cuda_error_name(123456, cuda::Api::Runtime), "");
  EXPECT_EQ(report::cuda_error_name(-1, cuda::Api::Driver), "");
}

TEST_F(ReportTest, Summary) {
  const json s = build(path_)["summary"];
  EXPECT_EQ(s["mode"], "command");
  EXPECT_EQ(s["command"], "./app --size 10");
  EXPECT_EQ(s["complete"], true);
  EXPECT_EQ(s["duration_ns"], 2000 * kMs);
  ASSERT_EQ(s["processes"].size(), 1u);
  EXPECT_EQ(s["processes"][0]["pid"], kPid);
  EXPECT_EQ(s["processes"][0]["comm"], "app");
  EXPECT_EQ(s["processes"][0]["exit_code"], 0);
  // Top-level calls only: the 8 driver calls made inside runtime calls are counted apart.
  EXPECT_EQ(s["calls"]["total"], 23);
  EXPECT_EQ(s["calls"]["nested"], 8);
  std::map<std::string, std::pair<int64_t, int64_t>> kinds;
  for (const auto& k : s["calls"]["by_kind"]) kinds[k["kind"]] = {k["runtime"], k["driver"]};
  EXPECT_EQ(kinds["launch"], std::make_pair(int64_t(4), int64_t(1)));
  EXPECT_EQ(kinds["memcpy"], std::make_pair(int64_t(6), int64_t(0)));
  EXPECT_EQ(kinds["alloc"], std::make_pair(int64_t(6), int64_t(0)));
  EXPECT_EQ(kinds["free"], std::make_pair(int64_t(3), int64_t(0)));
  EXPECT_EQ(kinds["sync"], std::make_pair(int64_t(3), int64_t(0)));
  ASSERT_EQ(s["libraries"].size(), 2u);
  EXPECT_EQ(s["libraries"][0]["runtime_probes"], 54);
  EXPECT_EQ(s["libraries"][1]["error"], "no symbols");
}

TEST_F(ReportTest, KernelsCountEachLaunchOnceWithShapesAndCallSites) {
  const json k = build(path_)["kernels"];
  EXPECT_EQ(k["launches"], 5);
  EXPECT_EQ(k["distinct"], 2);
  ASSERT_EQ(k["top"].size(), 2u);
  const json& vec = k["top"][0];
  EXPECT_EQ(vec["name"], "vecadd(float*, int)");
  EXPECT_EQ(vec["launches"], 4);
  EXPECT_EQ(vec["distinct_shapes"], 2);
  ASSERT_EQ(vec["shapes"].size(), 2u);
  EXPECT_EQ(vec["shapes"][0], json({{"grid", {128, 1, 1}}, {"block", {256, 1, 1}}, {"launches", 3}}));
  EXPECT_EQ(vec["shapes"][1]["grid"], json({64, 1, 1}));
  EXPECT_EQ(vec["shapes"][1]["launches"], 1);
  // Past the frame in libcudart and the kernel's host stub.
  ASSERT_EQ(vec["call_sites"].size(), 2u);
  EXPECT_EQ(vec["call_sites"][0], json({{"site", site("gs_report_test_site_a+0x0 (exe)", kSiteALine)}, {"launches", 3}}));
  EXPECT_EQ(vec["call_sites"][1], json({{"site", site("gs_report_test_site_b+0x0 (exe)", kSiteBLine)}, {"launches", 1}}));
  const json& unnamed = k["top"][1];
  EXPECT_EQ(unnamed["name"], "[unnamed 0xabc0]");
  EXPECT_EQ(unnamed["launches"], 1);
  EXPECT_EQ(unnamed["shapes"][0]["block"], json({32, 1, 1}));
  EXPECT_EQ(unnamed["call_sites"][0]["site"], "[no stack]");
}

TEST_F(ReportTest, CopiesByDirectionAndHostMemory) {
  const json c = build(path_)["copies"];
  std::map<std::pair<std::string, std::string>, json> by;
  for (const auto& row : c) by[{row["direction"], row["host_memory"]}] = row;
  ASSERT_EQ(by.size(), 4u);
  EXPECT_EQ((by[{"HtoD", "pinned"}]), json({{"direction", "HtoD"},
                                            {"host_memory", "pinned"},
                                            {"calls", 1},
                                            {"bytes", kMiB},
                                            {"cpu_time_ns", 100'000},
                                            {"failed", 0}}));
  const json& pageable = by[{"HtoD", "pageable"}];
  EXPECT_EQ(pageable["calls"], 3);
  EXPECT_EQ(pageable["bytes"], 4 * kMiB + 16);
  EXPECT_EQ(pageable["cpu_time_ns"], 805'000);
  EXPECT_EQ(pageable["failed"], 1);
  EXPECT_EQ((by[{"DtoH", "pageable"}]["bytes"]), 4096);
  EXPECT_EQ((by[{"DtoD", ""}]["bytes"]), 8 * kMiB);
  EXPECT_EQ(c[0]["direction"], "DtoD");  // by bytes
}

TEST_F(ReportTest, MemoryOverTimeAndLeaks) {
  const json r = build(path_);
  ASSERT_EQ(r["memory"].size(), 1u);
  const json& p = r["memory"][0];
  EXPECT_EQ(p["pid"], kPid);
  EXPECT_EQ(p["end"], "exit");
  const json& d = p["device"];
  EXPECT_EQ(d["peak_bytes"], 4 * kMiB + 256 * 1024);
  EXPECT_EQ(d["peak_at_ns"], 500 * kMs);
  EXPECT_EQ(d["in_use_at_end_bytes"], 256 * 1024);
  EXPECT_EQ(d["allocations"], 3);
  EXPECT_EQ(d["frees"], 2);
  EXPECT_EQ(d["failed_allocations"], 2);
  const json& h = p["pinned"];
  EXPECT_EQ(h["peak_bytes"], 64 * 1024);
  EXPECT_EQ(h["peak_at_ns"], 250 * kMs);
  EXPECT_EQ(h["in_use_at_end_bytes"], 0);

  // 50 points over the process's 1.5 s: point k at 1.5 s * k / 49.
  const json& series = p["series"];
  ASSERT_EQ(series.size(), 50u);
  EXPECT_EQ(series[0], json({{"t_ns", 0}, {"bytes", 0}, {"max_bytes", 0}}));
  EXPECT_EQ(series[14]["t_ns"], 1500 * kMs * 14 / 49);  // 0.43 s
  EXPECT_EQ(series[14]["bytes"], 4 * kMiB);
  EXPECT_EQ(series[17]["bytes"], 4 * kMiB + 256 * 1024);  // 0.52 s
  EXPECT_EQ(series[20]["bytes"], 256 * 1024);             // 0.61 s: just after the free at 0.6 s
  EXPECT_EQ(series[20]["max_bytes"], 4 * kMiB + 256 * 1024);
  EXPECT_EQ(series[49], json({{"t_ns", 1500 * kMs}, {"bytes", 256 * 1024}, {"max_bytes", 256 * 1024}}));

  const json& leaks = r["leaks"];
  EXPECT_EQ(leaks["allocations"], 1);
  EXPECT_EQ(leaks["bytes"], 256 * 1024);
  ASSERT_EQ(leaks["top"].size(), 1u);
  EXPECT_EQ(leaks["top"][0],
            json({{"site", site("gs_report_test_site_b+0x0 (exe)", kSiteBLine)},
                  {"function", "cudaMalloc"},
                  {"memory", "device"},
                  {"allocations", 1},
                  {"bytes", 256 * 1024},
                  {"stack", {"libcudart.so.13+0x1000", site("gs_report_test_site_b+0x0 (exe)", kSiteBLine), "0xdeadbeef"}}}));
}

TEST_F(ReportTest, ErrorsSyncAndLost) {
  const json r = build(path_);
  const json& e = r["errors"];
  ASSERT_EQ(e.size(), 4u);
  std::map<std::pair<std::string, int64_t>, json> by;
  for (const auto& row : e) by[{row["function"], row["code"]}] = row;
  EXPECT_EQ((by[{"cudaMalloc", 35}]), json({{"function", "cudaMalloc"},
                                            {"code", 35},
                                            {"error", "cudaErrorInsufficientDriver"},
                                            {"calls", 1},
                                            {"nested", 0},
                                            {"first_at_ns", 100 * kMs}}));
  EXPECT_EQ((by[{"cudaMalloc", 2}]["error"]), "cudaErrorMemoryAllocation");
  EXPECT_EQ((by[{"cuMemAlloc_v2", 2}]["error"]), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ((by[{"cuMemAlloc_v2", 2}]["nested"]), 1);
  EXPECT_EQ((by[{"cudaMemcpy", 1}]["error"]), "cudaErrorInvalidValue");
  EXPECT_EQ((by[{"cudaMemcpy", 1}]["first_at_ns"]), 903 * kMs);

  const json& s = r["sync"];
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], json({{"function", "cudaDeviceSynchronize"},
                        {"calls", 2},
                        {"total_ns", 4 * kMs},
                        {"mean_ns", 2 * kMs},
                        {"max_ns", 3 * kMs}}));
  EXPECT_EQ(s[1]["function"], "cudaStreamSynchronize");
  EXPECT_EQ(s[1]["calls"], 1);

  EXPECT_EQ(r["lost"]["total"], 5);
  EXPECT_EQ(r["lost"]["causes"], json::parse(R"([{"cause":"ringbuf_full","count":0},{"cause":"stack","count":3},
                                                {"cause":"queue_full","count":2}])"));
}

TEST_F(ReportTest, TextHasEverySection) {
  const std::string t = report::render_text(build(path_));
  EXPECT_TRUE(build(path_).at("cpu").is_null());  // recorded without --cpu-profile: no section
  EXPECT_EQ(t.find("CPU profile"), std::string::npos);
  for (const std::string& line : std::vector<std::string>{
           "gpuscope report: ./app --size 10 (command mode, host testhost)\nRecorded for 2.00 s.\n",
           "Calls: 23 in all (each counted once; not counting 8 driver calls made inside runtime calls):",
           "  launch        4       1\n",
           "  100               0              0  /usr/lib/x86_64-linux-gnu/libcuda.so.1  (error: no symbols)\n",
           "== Kernels: top 2 of 2 by launches (5 launches in all) ==",
           "         4  vecadd(float*, int)\n"
           "              grid(128,1,1) block(256,1,1) ×3\n"
           "              grid(64,1,1) block(256,1,1) ×1\n"
           "              from " + site("gs_report_test_site_a+0x0 (exe)", kSiteALine) + " ×3\n",
           "         1  [unnamed 0xabc0]\n",
           "  HtoD       pinned           1   1.00 MiB  100.0 µs       0\n",
           "  HtoD       pageable         3   4.00 MiB  805.0 µs       1\n",
           "  total                       6  13.00 MiB  965.0 µs       1\n",
           "  100  app      4.25 MiB  500.00 ms      256.0 KiB     64.0 KiB            0 B       4      3       2  "
           "exit\n",
           "== Never freed (by the process's exit or the recording's end): 256.0 KiB in 1 allocation ==",
           "  256.0 KiB       1  device  " + site("gs_report_test_site_b+0x0 (exe)", kSiteBLine) + " by cudaMalloc\n",
           "                               #2 0xdeadbeef\n",
           "  cudaMalloc       35  cudaErrorInsufficientDriver      1  100.00 ms\n",
           "  cuMemAlloc_v2     2  CUDA_ERROR_OUT_OF_MEMORY         1  700.00 ms  1 inside runtime calls\n",
           "  cudaDeviceSynchronize      2   4.00 ms   2.00 ms   3.00 ms\n",
           "  stack           3\n  queue_full      2\n  total           5\n",
       })
    EXPECT_NE(t.find(line), std::string::npos) << "missing: " << line << "\nin:\n" << t;
  EXPECT_EQ(t.find("cut short"), std::string::npos);
}

TEST(Report, RecordCutShort) {
  const std::string path = temp_record("cut_short");
  {
    Recording r(path, false);
    r.w.upsert_process(kPid, 1, "app", "./app", "/app", kStart);
    r.add(r.call("cudaDeviceSynchronize", 250, 0, 2 * kMs));
    r.w.commit();
  }
  const json j = build(path);
  EXPECT_EQ(j["summary"]["complete"], false);
  EXPECT_EQ(j["summary"]["duration_ns"], 252 * kMs);  // up to the end of the last call
  EXPECT_EQ(j["summary"]["processes"][0]["exit_code"], nullptr);
  EXPECT_EQ(j["kernels"]["launches"], 0);
  EXPECT_EQ(j["leaks"]["allocations"], 0);
  EXPECT_EQ(j["lost"]["counted"], false);
  const std::string t = report::render_text(j);
  EXPECT_NE(t.find("WARNING: this recording was cut short"), std::string::npos) << t;
  EXPECT_NE(t.find("  not known: the recording ended before gpuscope could write its counts\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("  no kernel launches\n"), std::string::npos) << t;
  std::filesystem::remove(path);
}

TEST(Report, NothingLost) {
  const std::string path = temp_record("nothing_lost");
  {
    Recording r(path);
    for (const char* cause : {"ringbuf_full", "stack", "queue_full"}) r.w.set_lost(cause, 0);
    r.w.finish();
  }
  const json j = build(path);
  EXPECT_EQ(j["lost"]["total"], 0);
  EXPECT_EQ(j["lost"]["causes"].size(), 3u);
  EXPECT_NE(report::render_text(j).find("== Lost events ==\n  no events lost\n"), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
