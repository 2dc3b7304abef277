// The flame graph's views of stacks with Python frames (--native auto, none, all) and the grouping
// of a library's unsymbolised frames: first on hand-made frames, then through build_flame and
// every output format on a hand-made record of a Python process.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include <filesystem>
#include <list>

#include "common/error.h"
#include "cuda/functions.h"
#include "report/flamegraph.h"
#include "report/stack_view.h"
#include "store/record_writer.h"

using namespace gpuscope;
using report::NamedFrame;
using report::NativeView;
using Kind = NamedFrame::Kind;

namespace {

// Frames made by hand, as FrameNamer makes them from a record.
class Frames {
 public:
  const NamedFrame* python(const std::string& text) {
    auto& f = make(Kind::Python, "[python]");
    f.function = text;
    return &f;
  }
  // A native frame in `path`; unsymbolised when `function` is "".
  const NamedFrame* native(const std::string& path, const std::string& function = "",
                           std::vector<std::string> inlined = {}) {
    auto& f = make(Kind::Native, path);
    f.function = function;
    f.inlined = std::move(inlined);
    f.interpreter = path.find("python3") != std::string::npos;
    return &f;
  }
  const NamedFrame* kernel(const std::string& function) {
    auto& f = make(Kind::Kernel, "[kernel]");
    f.function = function;
    return &f;
  }
  const NamedFrame* marker(const std::string& name) {
    auto& f = make(Kind::Marker, "[truncated]");
    f.function = name;
    return &f;
  }
  const NamedFrame* unknown(uint64_t ip) {
    auto& f = make(Kind::Unknown, "");
    rows_.back().in_file = false;
    rows_.back().ip = ip;
    return &f;
  }

 private:
  NamedFrame& make(Kind kind, const std::string& path) {
    rows_.push_back({});
    rows_.back().in_file = true;
    rows_.back().path = path;
    frames_.push_back({});
    frames_.back().kind = kind;
    frames_.back().row = &rows_.back();
    return frames_.back();
  }
  std::list<report::StoredFrameRow> rows_;  // stable addresses
  std::list<NamedFrame> frames_;
};

std::vector<std::string> labels(const std::vector<const NamedFrame*>& root_first, NativeView v) {
  std::vector<std::string> out;
  for (const auto& f : report::view_stack(root_first, v)) out.push_back(f.label);
  return out;
}

using Names = std::vector<std::string>;

// A launch from PyTorch-like code, root first: the interpreter's start, Python frames with the
// interpreter's and the extension's frames between them, then libtorch and the CUDA runtime.
class PythonStack : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string py = "/usr/bin/python3.12", tp = "/site-packages/torch/lib/libtorch_python.so",
                      tc = "/site-packages/torch/lib/libtorch_cuda.so", rt = "/nvidia/cu13/lib/libcudart.so.13";
    stack_ = {f_.native("/usr/lib/libc.so.6", "__libc_start_main"),
              f_.native(py, "Py_BytesMain"),
              f_.native(py),  // unsymbolised: the interpreter's static functions
              f_.native(py),
              f_.python("<module> (train.py:40)"),
              f_.native(py, "_PyObject_MakeTpCall"),
              f_.native(tp),  // the extension calling back into Python (__torch_function__)
              f_.native(tp),
              f_.native(py, "_PyFunction_Vectorcall"),
              f_.python("Model.forward (model.py:12)"),
              f_.native(py),  // the interpreter calling the extension
              f_.native(tp, "THPVariable_add"),
              f_.native(tp),
              f_.native(py),  // the extension calling the C API: not Python code
              f_.native(tp),
              f_.native("/site-packages/torch/lib/libtorch_cpu.so", "at::_ops::add_Tensor::call"),
              f_.native(tc),
              f_.native(tc),
              f_.native(tc),
              f_.native(rt, "cudaLaunchKernel")};
  }
  Frames f_;
  std::vector<const NamedFrame*> stack_;
};

TEST_F(PythonStack, AutoShowsPythonFramesAndTheExtensionBelowThem) {
  EXPECT_EQ(labels(stack_, NativeView::Auto),
            (Names{"<module> (train.py:40)", "Model.forward (model.py:12)", "THPVariable_add", "libtorch_python.so",
                   "at::_ops::add_Tensor::call", "libtorch_cuda.so", "cudaLaunchKernel"}));
}

TEST_F(PythonStack, NoneShowsPythonFramesAndTheInnermost) {
  EXPECT_EQ(labels(stack_, NativeView::None),
            (Names{"<module> (train.py:40)", "Model.forward (model.py:12)", "cudaLaunchKernel"}));
}

TEST_F(PythonStack, AllShowsEveryFrameWithALibrarysUnnamedRunsAsOne) {
  EXPECT_EQ(labels(stack_, NativeView::All),
            (Names{"__libc_start_main", "Py_BytesMain", "python3.12", "<module> (train.py:40)",
                   "_PyObject_MakeTpCall", "libtorch_python.so", "_PyFunction_Vectorcall",
                   "Model.forward (model.py:12)", "python3.12", "THPVariable_add", "libtorch_python.so",
                   "python3.12", "libtorch_python.so", "at::_ops::add_Tensor::call", "libtorch_cuda.so",
                   "cudaLaunchKernel"}));
}

TEST(StackView, TheInnermostFrameStaysEvenWhenItIsTheInterpreters) {
  // A CPU sample running the interpreter's own code (an int addition) under a Python frame.
  Frames f;
  const std::vector<const NamedFrame*> s{f.native("/usr/bin/python3.11", "Py_RunMain"), f.python("spin (busy.py:8)"),
                                         f.native("/usr/bin/python3.11"), f.native("/usr/bin/python3.11")};
  for (auto v : {NativeView::Auto, NativeView::None})
    EXPECT_EQ(labels(s, v), (Names{"spin (busy.py:8)", "python3.11"})) << report::to_string(v);
}

TEST(StackView, MarkersAndOsKernelFramesStayInEveryView) {
  // A sample in a system call, in a stack whose walk was cut short: its Python frames (outermost)
  // come before the marker, the native frames it reached after it.
  Frames f;
  const std::vector<const NamedFrame*> s{
      f.python("<module> (app.py:3)"), f.marker("[truncated stack]"), f.native("/usr/bin/python3.12"),
      f.native("/usr/lib/libc.so.6", "read"), f.kernel("ksys_read"), f.kernel("vfs_read")};
  EXPECT_EQ(labels(s, NativeView::Auto),
            (Names{"<module> (app.py:3)", "[truncated stack]", "read", "ksys_read_[k]", "vfs_read_[k]"}));
  EXPECT_EQ(labels(s, NativeView::None),
            (Names{"<module> (app.py:3)", "[truncated stack]", "read", "ksys_read_[k]", "vfs_read_[k]"}));
}

TEST(StackView, StacksWithoutPythonFramesKeepEveryFrame) {
  // A native program's launch (or a thread of a Python process that runs no Python).
  Frames f;
  const std::vector<const NamedFrame*> s{
      f.native("/app", "main"), f.native("/app", "work(int)", {"inline_helper()"}), f.native("/usr/lib/libfoo.so"),
      f.native("/usr/lib/libfoo.so"), f.native("/usr/lib/libbar.so"), f.unknown(0x7f0000001000),
      f.unknown(0x7f0000002000), f.native("/usr/lib/libfoo.so"), f.native("/cuda/libcudart.so.13", "cudaLaunchKernel")};
  const Names all{"main", "work(int)", "inline_helper()", "libfoo.so", "libbar.so", "[unknown]", "libfoo.so",
                  "cudaLaunchKernel"};
  for (auto v : {NativeView::Auto, NativeView::None, NativeView::All}) EXPECT_EQ(labels(s, v), all) << report::to_string(v);
}

TEST(StackView, ViewsByName) {
  EXPECT_EQ(report::parse_native_view("auto"), NativeView::Auto);
  EXPECT_EQ(report::parse_native_view("none"), NativeView::None);
  EXPECT_EQ(report::parse_native_view("all"), NativeView::All);
  EXPECT_THROW(report::parse_native_view("some"), Error);
}

// ---------------------------------------------------------------------------------------------
// Through build_flame, on a record of a Python process whose libraries are not on this machine
// (so their frames are unsymbolised, as a wheel's static functions are).

constexpr uint32_t kPid = 9;

class PythonFlame : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / fmt::format("gpuscope_view_{}", getpid())).string();
    store::RecordWriter w(path_);
    w.set_meta("start_ns", "0");
    w.set_meta("cpu_profile_hz", "100");
    w.upsert_process(kPid, 1, "python3", "python3 train.py", "/usr/bin/python3.12", 0);
    const int64_t py = w.intern_module("/nonexistent/bin/python3.12", "b1");
    const int64_t tc = w.intern_module("/nonexistent/torch/lib/libtorch_cuda.so", "b2");
    const int64_t rt = w.intern_module("/nonexistent/nvidia/lib/libcudart.so.13", "b3");
    const int64_t pym = w.intern_module("[python]", "");
    const int64_t k = w.intern_module("[kernel]", "test");
    w.add_symbol(k, 1, "do_syscall_64");
    const store::StoredFrame module{pym, uint64_t(w.intern_python_frame("<module>", "/home/u/train.py", 40)), 0},
        step{pym, uint64_t(w.intern_python_frame("step", "/home/u/train.py", 12)), 0};
    auto in = [](int64_t m, uint64_t off) { return store::StoredFrame{m, off, 0x1000 + off}; };
    // Innermost first.
    const int64_t launch = w.intern_stack({in(rt, 0x10), in(tc, 0x20), in(tc, 0x30), in(py, 0x40), step, in(py, 0x50),
                                           in(py, 0x60), module, in(py, 0x70)});
    const int64_t sample = w.intern_stack({in(py, 0x80), step, in(py, 0x50), module, in(py, 0x70)});
    const int64_t ksample = w.intern_stack({store::StoredFrame{k, 1, 1}});
    CallEvent e;
    e.func = cuda::function_by_symbol("cudaLaunchKernel")->id;
    e.pid = e.tid = kPid;
    e.stack_id = launch;
    for (int i = 1; i <= 3; ++i) {
      e.call_id = i;
      e.ts_ns = uint64_t(i) * 1000;
      w.add_call(e);
    }
    w.add_sample(10, kPid, kPid, 0, sample, 0);
    w.add_sample(20, kPid, kPid, 0, sample, ksample);
    w.finish();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  report::FlameData flame(report::Metric m, NativeView v) {
    store::RecordReader reader(path_);
    symbolize::Symbolizer sym;
    report::FlameOptions opt;
    opt.metric = m;
    opt.native = v;
    return report::build_flame(reader, sym, opt);
  }

  using Stacks = std::map<std::vector<std::string>, int64_t>;
  std::string path_;
};

TEST_F(PythonFlame, LaunchesInEachView) {
  const std::string proc = "python3 (9)", module = "<module> (/home/u/train.py:40)", step = "step (/home/u/train.py:12)";
  EXPECT_EQ(flame(report::Metric::Launches, NativeView::Auto).stacks,
            (Stacks{{{proc, module, step, "libtorch_cuda.so", "libcudart.so.13", "[unnamed kernel]"}, 3}}));
  EXPECT_EQ(flame(report::Metric::Launches, NativeView::None).stacks,
            (Stacks{{{proc, module, step, "libcudart.so.13", "[unnamed kernel]"}, 3}}));
  EXPECT_EQ(flame(report::Metric::Launches, NativeView::All).stacks,
            (Stacks{{{proc, "python3.12", module, "python3.12", step, "python3.12", "libtorch_cuda.so",
                      "libcudart.so.13", "[unnamed kernel]"},
                     3}}));
}

TEST_F(PythonFlame, CpuSamplesKeepTheirLeafAndKernelPart) {
  const auto d = flame(report::Metric::Cpu, NativeView::Auto);
  const std::string proc = "python3 (9)", module = "<module> (/home/u/train.py:40)", step = "step (/home/u/train.py:12)";
  EXPECT_EQ(d.stacks, (Stacks{{{proc, module, step, "python3.12"}, 10'000'000},
                              {{proc, module, step, "python3.12", "do_syscall_64_[k]"}, 10'000'000}}));
  EXPECT_NE(d.note.find("--native all"), std::string::npos);
  EXPECT_EQ(flame(report::Metric::Cpu, NativeView::All).note, "");
  // Every view weighs the same.
  for (auto v : {NativeView::None, NativeView::All}) EXPECT_EQ(flame(report::Metric::Cpu, v).total(), d.total());
}

std::string gunzip(const std::string& gz) {
  std::string raw(1 << 16, '\0');
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 15 + 16), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = uInt(gz.size());
  z.next_out = reinterpret_cast<Bytef*>(raw.data());
  z.avail_out = uInt(raw.size());
  EXPECT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
  raw.resize(z.total_out);
  inflateEnd(&z);
  return raw;
}

TEST_F(PythonFlame, EveryFormatGetsTheViewsFrames) {
  const auto d = flame(report::Metric::Launches, NativeView::Auto);
  EXPECT_EQ(report::to_folded(d),
            "python3 (9);<module> (/home/u/train.py:40);step (/home/u/train.py:12);libtorch_cuda.so;libcudart.so.13;"
            "[unnamed kernel] 3\n");
  const std::string html = report::to_html(d, "launches");
  EXPECT_NE(html.find("\"libtorch_cuda.so\""), std::string::npos);
  EXPECT_EQ(html.find("python3.12"), std::string::npos);
  EXPECT_EQ(html.find("+0x"), std::string::npos);
  // pprof: the same names; the libraries as mappings (file and build id), the Python frames'
  // files and lines.
  const std::string raw = gunzip(report::to_pprof(d));
  for (const char* s : {"libtorch_cuda.so", "/nonexistent/torch/lib/libtorch_cuda.so", "b2",
                        "/nonexistent/nvidia/lib/libcudart.so.13", "b3", "/home/u/train.py"})
    EXPECT_NE(raw.find(s), std::string::npos) << s;
  EXPECT_EQ(raw.find("python3.12"), std::string::npos);
  EXPECT_EQ(raw.find("+0x"), std::string::npos);
}

}  // namespace
