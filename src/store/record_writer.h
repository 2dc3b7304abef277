// Writes a record file. One thread (the pipeline) calls it; SQLite runs on a writer thread of
// its own, so decoding and inserting use two cores. Calls and other rows accumulate in a batch
// that commit() hands to the writer, which inserts it as one transaction: a recording cut
// short keeps every committed batch. Ids are assigned here, not by SQLite, so nothing waits
// for the writer; at most kMaxQueuedBatches wait for it (commit blocks past that).
// A full disk stops the recording, not the program recorded: space kept aside at the start is
// given back, what was committed is folded into the record, later batches are dropped (their
// calls counted as lost, cause disk_full) and the record is closed readable at finish. Other
// errors on the writer thread are reported once and the batch is dropped.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/model.h"
#include "gpu/nvml.h"
#include "store/rdma_rows.h"
#include "store/sink.h"
#include "store/sqlite.h"

namespace gpuscope::store {

class RecordWriter final : public EventSink {
 public:
  // A record for `path`, written first to a hidden temporary file beside it: `path` is replaced
  // only once keep() was called (with the next batch written) or at finish, so that a recording
  // that never began (a command that cannot run) leaves it as it was. Throws
  // Error for an empty path, one that exists and is not a regular file (a device, a directory),
  // or one that cannot be written.
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();

  // set_meta and add_gpu may be called from any thread; the rest from one thread only.
  void set_meta(const std::string& key, const std::string& value) override;
  void add_call(const CallEvent& e) override;
  int64_t intern_kernel(const std::string& name, const std::string& demangled) override;
  int64_t intern_module(const std::string& path, const std::string& build_id) override;
  int64_t intern_stack(const std::vector<StoredFrame>& frames) override;
  void upsert_process(uint32_t pid, uint32_t ppid, const std::string& comm, const std::string& cmdline,
                      const std::string& exe, uint64_t ts_ns) override;
  void set_process_exit(uint32_t pid, uint64_t ts_ns, int exit_code) override;
  void upsert_thread(uint32_t tid, uint32_t pid, const std::string& comm) override;
  void add_library(const LibraryRow& lib) override;
  // A CPU profile sample; stack ids from intern_stack (0: none).
  void add_sample(uint64_t ts_ns, uint32_t pid, uint32_t tid, uint32_t cpu, int64_t stack_id, int64_t kernel_stack_id) override;
  void add_thread_time(const ThreadTimeRow& r) override;
  void add_host_alloc(const HostAllocRow& r) override;
  void add_rdma(const RdmaEvent& e) override;
  // A frame's name known only while recording (kernel frames, from /proc/kallsyms).
  void add_symbol(int64_t module_id, uint64_t offset, const std::string& name) override;
  void set_lost(const std::string& cause, uint64_t count) override;
  // A Python frame (function, file, line): its id, the offset of a stack frame in module
  // "[python]".
  int64_t intern_python_frame(const std::string& function, const std::string& file, int line) override;
  // NVML: the GPUs, and one sampler tick's readings.
  void add_gpu(const gpu::GpuDevice& d) override;
  void add_gpu_batch(const gpu::NvmlSampler::Batch& b) override;
  void add_pressure(const host::PressureReading& r) override;

  void commit() override;
  // The recording has begun: the record may take `path`'s place.
  void keep();
  // The recording never began: the temporary file goes at destruction; `path` is untouched.
  void discard();
  // Committed batches are folded from the write-ahead log into the main file this often: a
  // record killed with kill -9 is readable from that one file, less its last interval.
  static constexpr uint64_t kCheckpointNs = 1'000'000'000;
  // Writes what is queued, indexes, marks the record complete, and (unless `seal_later`) folds
  // the write-ahead log into the one file. With `seal_later` the record stays in WAL mode, so
  // that what others then write into it through their own connections (GPU times, the
  // recorder's peak memory) goes through the log: written in rollback mode, a kill would leave a
  // hot -journal beside the record that a read-only reader cannot roll back. seal() (or the
  // destructor) folds it then.
  void finish(bool seal_later = false);
  void seal();

  // Space held aside for the end of a recording on a disk that fills: an unlinked file of this
  // size, open until the disk fills (or gpuscope exits, even by kill -9). Folding the last
  // second's write-ahead log into the record needs about as much as the log holds, which
  // checkpoints keep under kMaxWalBytes.
  static constexpr off_t kReserveBytes = 16 << 20;
  static constexpr uint64_t kMaxWalBytes = 8 << 20;
  // The disk filled: nothing more is written but the record's end (any thread may ask).
  bool disk_full() const { return disk_full_.load(); }
  // Calls not written because the disk was full (read after finish).
  uint64_t calls_dropped() const { return calls_dropped_; }

 private:
  struct FrameVecHash {
    size_t operator()(const std::vector<StoredFrame>& v) const;
  };
  // Rows other than calls, in the order they were made.
  using Op = std::function<void()>;
  struct Batch {
    std::vector<Op> ops;
    std::vector<CallEvent> calls;
    bool last = false;  // finish's: after a full disk, its rows (meta, lost) are still tried
  };
  static constexpr size_t kMaxQueuedBatches = 4;

  void insert_call(const CallEvent& e);
  void insert_nccl_call(const CallEvent& e, const cuda::FunctionSpec& f);  // its nccl_calls row
  void write_loop();
  void write_batch(Batch& b);
  // The disk filled while writing a batch (rolled back): stop, give the reserve back, fold.
  void on_disk_full(const Batch& b);
  // After the disk filled: only the last batch's rows are tried, one by one.
  void write_after_full(Batch& b);
  void push_batch(bool last);
  void stop_writer();

  void prepare_statements();
  void close_statements();
  void checkpoint();  // on the writer thread
  // The record takes -o's place (on the writer thread, or once it stopped).
  void place();
  // The write-ahead log into the main file; on a full disk the reserve is given back for it.
  // False if the disk is too full even then. `one_file`: back to a rollback journal too, what a
  // finished record is; without it the file stays in WAL mode, so that opening it again writes
  // nothing. (A switch of journal mode through a -journal, killed, would leave a hot journal at
  // the record that a read-only reader cannot roll back.)
  bool fold(bool one_file);

  // The temporary file, removed once the database is closed if the recording never began.
  struct TempFile {
    std::string path;
    bool remove = false;
    ~TempFile();
  };
  const std::string path_;
  TempFile temp_;
  Db db_;
  Stmt insert_call_, insert_nccl_call_, insert_kernel_, insert_module_, insert_stack_, insert_frame_, upsert_process_, process_exit_,
      upsert_thread_, insert_library_, set_lost_, set_meta_, insert_sample_, insert_thread_time_, insert_symbol_, insert_python_frame_, insert_gpu_, insert_gpu_sample_,
      insert_gpu_process_, insert_gpu_event_, insert_pressure_, insert_host_alloc_;
  RdmaRows rdma_;
  std::unordered_map<std::string, int64_t> kernels_;
  std::unordered_map<std::string, int64_t> modules_;
  std::unordered_map<std::string, int64_t> python_frames_;
  std::unordered_map<std::vector<StoredFrame>, int64_t, FrameVecHash> stacks_;
  int64_t next_stack_id_ = 1, next_kernel_id_ = 1, next_module_id_ = 1, next_python_frame_id_ = 1;
  bool finished_ = false, sealed_ = false;
  std::atomic<bool> keep_{false};
  bool placed_ = false;         // the writer thread's, then finish's
  bool dirty_ = false;          // committed since the last checkpoint
  uint64_t last_checkpoint_ns_ = 0;

  Batch filling_;
  // Rows made by other threads (the recorder's), joined to the batch at commit.
  std::mutex cross_mu_;
  std::vector<Op> cross_ops_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stopping_ = false;
  bool error_reported_ = false;
  int reserve_fd_ = -1;
  std::atomic<bool> disk_full_{false};
  uint64_t calls_dropped_ = 0;  // the writer thread's: calls not written after the disk filled
  std::atomic<uint64_t> wal_frames_{0};  // pages in the write-ahead log (SQLite's WAL hook)
  std::thread writer_;
};

}  // namespace gpuscope::store
