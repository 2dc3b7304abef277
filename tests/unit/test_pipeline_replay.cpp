// The pipeline driven by ring-buffer records without BPF: records captured from a real run
// (tests/data/make_captures.sh) replayed into a record, and crafted ones for what a run rarely
// shows (a pid reused after an exit, damaged input). The kernel's stack maps are stood in for by
// a StackMaps that remembers what it was asked.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/functions.h"
#include "record/pipeline.h"
#include "store/record_writer.h"

using namespace gpuscope;

namespace {

class RememberingStackMaps final : public record::StackMaps {
 public:
  std::vector<uint64_t> kernel_stack(int32_t) const override { return {}; }
  uint32_t kernel_stack_entries() const override { return 0; }
  int flip_kernel_stacks() override { return ++flips & 1; }
  void clear_kernel_stacks(int) override {}
  void forget_native_stacks(const std::vector<uint64_t>& ids) override {
    forgotten.insert(forgotten.end(), ids.begin(), ids.end());
  }
  void forget_python_stacks() override { ++python_forgets; }
  int flips = 0, python_forgets = 0;
  std::vector<uint64_t> forgotten;
};

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / fmt::format("gpuscope_replay_{}_{}", name, getpid());
}

// Each row's columns joined by '|'.
std::vector<std::string> rows(const std::filesystem::path& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::vector<std::string> out;
  EXPECT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  while (st && sqlite3_step(st) == SQLITE_ROW) {
    std::string row;
    for (int i = 0; i < sqlite3_column_count(st); ++i) {
      if (i) row += '|';
      const auto* text = sqlite3_column_text(st, i);
      row += text ? reinterpret_cast<const char*>(text) : "NULL";
    }
    out.push_back(row);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// A pid no process has now, so that nothing is read from /proc for it.
uint32_t free_pid() {
  for (uint32_t pid = 4'000'000;; ++pid)
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return pid;
}

// Records as the ring buffer holds them, pushed into a pipeline that writes a record.
class Replay {
 public:
  explicit Replay(const std::string& name) : path_(temp_path(name)), writer_(path_.string()) {
    writer_.set_meta("start_ns", "0");
    record::PipelineConfig cfg;
    cfg.complete_history = true;  // as under `record -- CMD`
    pipeline_ = std::make_unique<record::Pipeline>(writer_, stack_maps_, nullptr, maps_, cfg);
  }
  ~Replay() { std::filesystem::remove(path_); }
  record::Pipeline& pipeline() { return *pipeline_; }
  template <typename R>
  void push(const R& r, size_t size = sizeof(R)) {
    pipeline_->push(&r, size);
  }
  // Processes everything pushed and writes the record; returns its path.
  const std::filesystem::path& finish() {
    pipeline_->end_batch();
    pipeline_->start();
    pipeline_->stop();
    writer_.finish();
    return path_;
  }
  RememberingStackMaps& stack_maps() { return stack_maps_; }

 private:
  std::filesystem::path path_;
  store::RecordWriter writer_;
  symbolize::ProcessMaps maps_;
  RememberingStackMaps stack_maps_;
  std::unique_ptr<record::Pipeline> pipeline_;
};

gs_call_record call(std::string_view symbol, uint32_t pid, uint64_t ts_ns, uint64_t native_stack = 0) {
  gs_call_record r{};
  r.kind = GS_REC_CALL;
  r.func = cuda::function_by_symbol(symbol)->id;
  r.flags = GS_CALL_HAS_RETURN;
  r.ts_ns = ts_ns;
  r.duration_ns = 10;
  r.pid = r.tid = pid;
  r.native_stack = native_stack;
  r.args[1] = 4096;
  std::strcpy(r.comm, "app");
  return r;
}

gs_proc_record proc(uint16_t kind, uint32_t pid, uint64_t ts_ns) {
  gs_proc_record r{};
  r.kind = kind;
  r.pid = pid;
  r.ts_ns = ts_ns;
  std::strcpy(r.comm, "app");
  return r;
}

}  // namespace

TEST(PipelineReplay, ARealRunReplaysIntoTheCallsStacksSamplesAndExitsItsRecordHad) {
  // What the record written live beside the capture held (make_captures.sh prints it).
  Replay replay("real");
  record::replay_capture(std::string(GPUSCOPE_SOURCE_DIR) + "/tests/data/py_cuda.ring", replay.pipeline());
  const auto& db = replay.finish();

  const auto calls = rows(db, "SELECT c.pid, f.name FROM calls c JOIN functions f ON f.id = c.func ORDER BY c.id");
  ASSERT_EQ(calls.size(), 7u);
  const std::string parent = calls[0].substr(0, calls[0].find('|'));
  const std::string child = calls[6].substr(0, calls[6].find('|'));
  EXPECT_NE(parent, child);
  EXPECT_EQ(calls, (std::vector<std::string>{parent + "|cudaMalloc", parent + "|cudaMalloc", parent + "|cudaMalloc",
                                             parent + "|cuLaunchKernel", parent + "|cuLaunchKernel",
                                             parent + "|cudaDeviceSynchronize", child + "|cudaFree"}));

  // Python frames, named from the code records alone (the processes are long gone), innermost first.
  std::vector<std::string> stacks;
  std::string last_call;
  for (const auto& row : rows(db, "SELECT c.id, p.function FROM calls c JOIN stack_frames sf ON sf.stack_id = c.stack_id "
                                  "JOIN modules m ON m.id = sf.module_id AND m.path = '[python]' "
                                  "JOIN python_frames p ON p.id = sf.offset ORDER BY c.id, sf.depth")) {
    const std::string id = row.substr(0, row.find('|')), function = row.substr(row.find('|') + 1);
    if (id != last_call) stacks.push_back(id + "|" + function);
    else stacks.back() += " < " + function;
    last_call = id;
  }
  EXPECT_EQ(stacks, (std::vector<std::string>{
                        "1|allocate < Model.step < main < <module>", "2|allocate < Model.step < main < <module>",
                        "3|allocate < Model.step < main < <module>", "4|Model.launch < main < <module>",
                        "5|Model.launch < main < <module>",
                        "6|in_thread < Thread.run < Thread._bootstrap_inner < Thread._bootstrap",
                        "7|in_child < main < <module>"}));
  // The three allocations came from one place: one stack.
  EXPECT_EQ(rows(db, "SELECT count(DISTINCT stack_id) FROM calls WHERE func = (SELECT id FROM functions WHERE name = "
                     "'cudaMalloc')"),
            std::vector<std::string>{"1"});

  EXPECT_EQ(rows(db, "SELECT count(*), count(stack_id) FROM samples"), std::vector<std::string>{"19|19"});
  EXPECT_EQ(rows(db, fmt::format("SELECT exit_code FROM processes WHERE pid IN ({}, {})", parent, child)),
            (std::vector<std::string>{"0", "0"}));
  EXPECT_EQ(rows(db, "SELECT cause FROM lost WHERE count > 0"), std::vector<std::string>{});
}

TEST(PipelineReplay, AnExitLetsGoOfTheProcessStacksSoAReusedPidGetsNoneOfThem) {
  Replay replay("reuse");
  const uint32_t pid = free_pid();
  gs_native_stack_record stack{};
  stack.kind = GS_REC_NATIVE_STACK;
  stack.pid = pid;
  stack.id = 77;
  stack.flags = GS_NATIVE_COMPLETE;
  stack.nr = 2;
  stack.ips[0] = 0x1000;
  stack.ips[1] = 0x2000;
  replay.push(stack, offsetof(gs_native_stack_record, ips) + 2 * sizeof(uint64_t));
  replay.push(call("cudaMalloc", pid, 100, 77));
  replay.push(proc(GS_REC_EXIT, pid, 200));
  // Another process given the same pid, naming the same stack id: the BPF side was told to send
  // that stack again, and this one did not come.
  replay.push(call("cudaMalloc", pid, 300, 77));
  const auto& db = replay.finish();

  EXPECT_EQ(replay.stack_maps().forgotten, std::vector<uint64_t>{77});
  EXPECT_EQ(rows(db, "SELECT c.ts_ns, (SELECT count(*) FROM stack_frames sf WHERE sf.stack_id = c.stack_id) "
                     "FROM calls c ORDER BY c.ts_ns"),
            (std::vector<std::string>{"100|2", "300|0"}));
  EXPECT_EQ(rows(db, "SELECT count FROM lost WHERE cause = 'unwind_stack_unknown'"), std::vector<std::string>{"1"});
}

TEST(PipelineReplay, EachKindOfRecordIsRoutedOnceAndShortOnesAreDropped) {
  Replay replay("routes");
  std::vector<uint16_t> control;
  replay.pipeline().on_control_record([&](uint16_t kind, const void*) { control.push_back(kind); });
  const uint32_t pid = free_pid();
  gs_libload_record load{};
  load.kind = GS_REC_LIBLOAD;
  replay.push(load);                                  // the control loop's alone
  replay.push(proc(GS_REC_EXEC, pid, 100));           // both
  replay.push(call("cudaFree", pid, 150));            // the pipeline's
  replay.push(proc(GS_REC_EXIT, pid, 200), 8);        // cut short: neither uses it
  replay.push(proc(GS_REC_EXIT, pid, 300));           // both
  const uint16_t unknown = 0x7fff;
  replay.push(unknown);                               // a later kind: ignored
  const auto& db = replay.finish();

  EXPECT_EQ(control, (std::vector<uint16_t>{GS_REC_LIBLOAD, GS_REC_EXEC, GS_REC_EXIT}));
  EXPECT_EQ(replay.pipeline().stats().records, 5u);  // all but the library load reached the pipeline
  EXPECT_EQ(replay.pipeline().stats().calls, 1u);
  EXPECT_EQ(rows(db, fmt::format("SELECT exit_code, exit_ns FROM processes WHERE pid = {}", pid)),
            std::vector<std::string>{"0|300"});
}

TEST(PipelineReplay, ADamagedCaptureIsRefusedWithWhatIsWrong) {
  const auto path = temp_path("damaged");
  auto expect_error = [&](const std::string& bytes, const std::string& says) {
    std::ofstream(path, std::ios::binary) << bytes;
    Replay replay("damaged_out");
    try {
      record::replay_capture(path.string(), replay.pipeline());
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_error("not a capture at all", "is not a capture");
  std::string head("gpuscope-ring-1", 16);
  auto chunk = [](uint32_t type, const std::string& body, uint32_t size) {
    std::string c(8, '\0');
    std::memcpy(c.data(), &type, 4);
    std::memcpy(c.data() + 4, &size, 4);
    return c + body;
  };
  expect_error(head + chunk(1, "abc", 100), "cut short");
  const uint32_t too_long = 1000;
  expect_error(head + chunk(1, std::string(reinterpret_cast<const char*>(&too_long), 4) + "xxxx", 8),
               "runs past its batch");
  std::filesystem::remove(path);
}
