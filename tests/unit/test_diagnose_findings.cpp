// diagnose's rules on crafted records: who ended a wait decides what it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>

#include "cuda/functions.h"
#include "diagnose/analysis.h"
#include "store/record_reader.h"
#include "store/record_writer.h"

using namespace gpuscope;

namespace {

constexpr uint32_t kPid = 100, kAutograd = 101, kHelper = 102;
constexpr uint64_t kStepNs = 10'000'000;

// 40 steps of 10 ms: the main thread copies in and launches, the autograd thread launches; the
// main thread blocks 5 ms a step in futex, ended by `waker` (a thread of the process).
std::string record_with_waits(const std::string& name, uint32_t waker) {
  const auto path = (std::filesystem::temp_directory_path() / fmt::format("gpuscope_diag_{}_{}", name, getpid())).string();
  store::RecordWriter w(path);
  w.set_meta("start_ns", "0");
  w.set_meta("host_telemetry", "1");
  w.upsert_process(kPid, 1, "python3", "python3 train.py", "/usr/bin/python3", 0);
  int64_t next_id = 1;
  auto call = [&](std::string_view fn, uint32_t tid, uint64_t ts, uint64_t handle) {
    CallEvent e;
    e.call_id = next_id++;
    e.func = cuda::function_by_symbol(fn)->id;
    e.pid = kPid;
    e.tid = tid;
    e.ts_ns = ts;
    e.has_return = true;
    e.kernel_handle = handle;
    w.add_call(e);
  };
  for (uint64_t s = 0; s < 40; ++s) {
    const uint64_t t = 1'000'000 + s * kStepNs;
    call("cudaMemcpyAsync", kPid, t, 0);
    call("cudaLaunchKernel", kPid, t + 100'000, 0xa0);
    call("cudaLaunchKernel", kAutograd, t + 6'000'000, 0xb0);
    store::ThreadTimeRow r;
    r.pid = kPid;
    r.tid = kPid;
    r.start_ns = t;
    r.end_ns = t + kStepNs;
    r.on_cpu_ns = 5'000'000;
    r.lock_ns = 5'000'000;
    r.blocked_ns = 5'000'000;
    r.waker_tid = waker;
    r.waker_pid = kPid;
    r.waker_comm = "python3";
    r.state = "on_cpu";
    w.add_thread_time(r);
  }
  w.finish();
  return path;
}

std::vector<std::string> causes(const std::string& path) {
  store::RecordReader reader(path);
  const auto d = diagnose::diagnose(reader);
  std::vector<std::string> out;
  for (const auto& p : d.processes)
    for (const auto& f : p.findings) out.push_back(f.cause);
  std::filesystem::remove(path);
  return out;
}

}  // namespace

TEST(DiagnoseFindings, WaitingForTheThreadThatCarriesOnTheGpuWorkIsNoFinding) {
  // PyTorch's main thread waits while its autograd engine launches the backward pass.
  EXPECT_EQ(causes(record_with_waits("handoff", kAutograd)), std::vector<std::string>{"none"});
}

TEST(DiagnoseFindings, WaitingForAThreadThatMakesNoCudaCallIsLockWait) {
  // A preprocessing thread holding the GIL.
  EXPECT_EQ(causes(record_with_waits("lock", kHelper)), std::vector<std::string>{"lock_wait"});
}
