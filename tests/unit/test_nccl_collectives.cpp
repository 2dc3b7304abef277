// Each NCCL collective's GPU time, tied to it by thread and order: collectives are probed at entry
// only, so their kernels are NCCL's own launched after the call's entry (the group's end's, in a
// group) and before the thread's next NCCL call; another kernel of the thread is never taken.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "cuda/functions.h"
#include "report/nccl_collectives.h"
#include "store/record_writer.h"
#include "store/sqlite.h"

using namespace gpuscope;

namespace {

constexpr int64_t kUs = 1000;

struct Launch {
  int64_t call_id, start_ns, end_ns;
};

class NcclRecord {
 public:
  explicit NcclRecord(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / fmt::format("gpuscope_nccl_{}_{}", name, getpid())).string()),
        w_(std::make_unique<store::RecordWriter>(path_)) {
    w_->set_meta("start_ns", "0");
    w_->upsert_process(300, 1, "python3", "python3 train.py", "/usr/bin/python3", 0);
  }
  ~NcclRecord() { std::filesystem::remove(path_); }

  // A call of thread 300 at `ts`; entry only unless `duration` is given (records before
  // collectives were probed at entry only).
  int64_t call(std::string_view fn, int64_t ts, std::optional<NcclArgs> nccl = std::nullopt,
               std::optional<int64_t> duration = std::nullopt, int64_t kernel_id = 0) {
    CallEvent e;
    e.call_id = next_id_++;
    e.func = cuda::function_by_symbol(fn)->id;
    e.pid = e.tid = 300;
    e.ts_ns = uint64_t(ts);
    e.has_return = duration.has_value();
    e.duration_ns = uint64_t(duration.value_or(0));
    e.nccl = nccl;
    e.kernel_id = kernel_id;
    w_->add_call(e);
    return e.call_id;
  }
  // A kernel launched at `ts`, run from `start` for `length`.
  void kernel(const std::string& name, const std::string& demangled, int64_t ts, int64_t start, int64_t length) {
    const int64_t id = call("cuLaunchKernelEx", ts, std::nullopt, std::nullopt, w_->intern_kernel(name, demangled));
    launches_.push_back({id, start, start + length});
  }
  report::NcclCollectives read() {
    w_->finish();
    w_.reset();
    store::Db db(path_, store::Db::Mode::Create);
    auto ins = db.prepare(
        "INSERT INTO gpu_activities(pid, kind, gpu, stream, start_ns, end_ns, name, call_id) "
        "VALUES(300, 'kernel', 0, 7, ?1, ?2, 'k', ?3)");
    for (const auto& l : launches_) {
      ins.bind(1, l.start_ns).bind(2, l.end_ns).bind(3, l.call_id);
      ins.step();
      ins.reset();
    }
    return report::read_nccl_collectives(db);
  }

 private:
  std::string path_;
  std::unique_ptr<store::RecordWriter> w_;
  int64_t next_id_ = 1;
  std::vector<Launch> launches_;
};

NcclArgs on_comm(int64_t group = 0) {
  NcclArgs a;
  a.comm = 0xc0;
  a.count = 1024;
  a.datatype = 7;
  a.group = group;
  return a;
}

const std::string kAllReduce = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LLP19ncclDevKernelArgs4K";
const std::string kSendRecv = "_Z24ncclDevKernel_SendRecvP19ncclDevKernelArgs4K";

}  // namespace

TEST(NcclCollectives, EntryOnlyCallsTakeNcclsKernelsBeforeTheThreadsNextNcclCall) {
  NcclRecord r("entry_only");
  r.kernel("_Z4gemmv", "gemm()", 10 * kUs, 100 * kUs, 50 * kUs);  // before: the model's
  r.call("ncclAllReduce", 20 * kUs, on_comm());
  r.kernel(kAllReduce, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs4K*)", 25 * kUs, 150 * kUs, 80 * kUs);
  r.kernel("_Z4reluv", "relu()", 30 * kUs, 230 * kUs, 5 * kUs);  // after, before the next NCCL call: not NCCL's
  // A group: its kernel is launched in its ncclGroupEnd.
  const int64_t start = r.call("ncclGroupStart", 40 * kUs, on_comm());
  r.call("ncclSend", 41 * kUs, on_comm(start));
  r.call("ncclRecv", 42 * kUs, on_comm(start));
  r.call("ncclGroupEnd", 43 * kUs, on_comm(start));
  r.kernel(kSendRecv, "ncclDevKernel_SendRecv(ncclDevKernelArgs4K*)", 44 * kUs, 300 * kUs, 20 * kUs);
  // The last NCCL call of the thread: its kernel, wherever it comes after.
  r.call("ncclAllReduce", 60 * kUs, on_comm());
  r.kernel(kAllReduce, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs4K*)", 90 * kUs, 400 * kUs, 30 * kUs);
  r.kernel("_Z4gemmv", "gemm()", 95 * kUs, 430 * kUs, 50 * kUs);
  const auto n = r.read();
  ASSERT_TRUE(n.gpu_times);
  ASSERT_EQ(n.calls.size(), 4u);
  const std::pair<int64_t, int64_t> want[] = {
      {150 * kUs, 230 * kUs}, {300 * kUs, 320 * kUs}, {300 * kUs, 320 * kUs}, {400 * kUs, 430 * kUs}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(n.calls[i].returned) << i;
    EXPECT_EQ(std::pair(n.calls[i].gpu_start_ns, n.calls[i].gpu_end_ns), want[i]) << n.calls[i].function << " " << i;
  }
}

TEST(NcclCollectives, ACallWhoseReturnWasProbedTakesTheKernelsLaunchedWithinIt) {
  // Records made before: the call's span is its own.
  NcclRecord r("returned");
  r.call("ncclAllReduce", 20 * kUs, on_comm(), 10 * kUs);
  r.kernel(kAllReduce, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs4K*)", 25 * kUs, 150 * kUs, 80 * kUs);
  r.kernel(kAllReduce, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs4K*)", 35 * kUs, 300 * kUs, 80 * kUs);
  const auto n = r.read();
  ASSERT_EQ(n.calls.size(), 1u);
  EXPECT_TRUE(n.calls[0].returned);
  EXPECT_EQ(n.calls[0].enqueue_ns, 10 * kUs);
  EXPECT_EQ(std::pair(n.calls[0].gpu_start_ns, n.calls[0].gpu_end_ns), std::pair(150 * kUs, 230 * kUs));
}
