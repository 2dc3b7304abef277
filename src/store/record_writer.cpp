#include "store/record_writer.h"

#include <pthread.h>
#include <signal.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <type_traits>

#include "common/clock.h"
#include "common/error.h"
#include "common/thread_name.h"
#include "cuda/functions.h"
#include "decode/nccl.h"
#include "store/schema.h"

namespace gpuscope::store {
namespace {

// Where a record for `path` may be written, or Error: absent, or a regular file (through a
// symbolic link: the file it names). gpuscope runs as root: /dev/null, a directory or a socket
// given as -o must stay what they are.
std::filesystem::path checked_output(const std::string& path) {
  if (path.empty()) throw Error("-o needs a file name, e.g. -o run.gpuscope");
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return std::filesystem::absolute(path);
  if (st.type() == std::filesystem::file_type::directory)
    throw Error("'{}' is a directory: give -o a file name in it, e.g. {}/run.gpuscope", path, path);
  if (st.type() != std::filesystem::file_type::regular)
    throw Error("'{}' is not a regular file: -o takes the path of a record file to write (gpuscope replaces only a "
                "regular file, and only once recording has begun)",
                path);
  const auto real = std::filesystem::canonical(path, ec);
  return ec ? std::filesystem::absolute(path) : real;
}

// gpuscope's own hidden files beside a record: .NAME.gpuscope-PID.KIND, where KIND is
// "partial" (the record written until it takes NAME's place) or "reserve" (space held aside,
// unlinked as soon as made).
std::string hidden_prefix(const std::filesystem::path& record) {
  return fmt::format(".{}.gpuscope-", record.filename().string());
}

std::filesystem::path hidden_beside(const std::filesystem::path& record, std::string_view kind) {
  return record.parent_path() / fmt::format("{}{}.{}", hidden_prefix(record), getpid(), kind);
}

std::string temporary_beside(const std::filesystem::path& path) { return hidden_beside(path, "partial").string(); }

void remove_db_files(const std::string& path) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::filesystem::remove(path + suffix, ec);
}

// Hidden files of earlier recordings to the same path whose gpuscope died before the record
// took its place (kill -9 during start-up): removed once no process has that PID.
void remove_stale_temporaries(const std::filesystem::path& path) {
  const std::string prefix = hidden_prefix(path);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const size_t dot = name.rfind('.');
    if (dot < prefix.size() || (name.substr(dot) != ".partial" && name.substr(dot) != ".reserve")) continue;
    const std::string pid_text = name.substr(prefix.size(), dot - prefix.size());
    pid_t pid = 0;
    const auto [end, err] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (err != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) remove_db_files(entry.path().string());
  }
}

// Per connection (journal_mode=WAL also in the file).
void configure(Db& db) {
  // A WAL keeps committed batches safe if we are killed; synchronous=OFF is durable across a
  // crash of this process, which is the failure that matters here.
  db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF; PRAGMA cache_size=-16384; PRAGMA temp_store=MEMORY;");
  // Checkpoints are this writer's (RecordWriter::checkpoint): the main file stays a readable record.
  db.exec("PRAGMA wal_autocheckpoint=0;");
}

Db create_db(const std::string& path, const std::string& shown) {
  remove_db_files(path);
  remove_stale_temporaries(std::filesystem::absolute(shown));
  try {
    Db db(path, Db::Mode::Create);
    db.exec("PRAGMA page_size=65536;");
    configure(db);
    // One transaction: each statement on its own would append its pages to the write-ahead
    // log again (64 KiB each), megabytes before the first call is recorded.
    db.exec("BEGIN");
    db.exec(kSchemaSql);
    db.exec("COMMIT");
    return db;
  } catch (const Error& e) {
    remove_db_files(path);
    throw Error("cannot write the record file '{}': {}; choose a writable path with -o", shown, e.what());
  }
}

// Space held aside in the record's directory: an unnamed file (O_TMPFILE; else one created and
// unlinked at once) whose blocks go back to the file system when it is closed, even when
// gpuscope is killed. -1 where the file system cannot hold one; Error when it has too little room.
int make_reserve(const std::filesystem::path& record, off_t bytes) {
  const auto dir = record.parent_path();
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const auto named = hidden_beside(record, "reserve");
    fd = ::open(named.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    ::unlink(named.c_str());
  }
  if (const int err = posix_fallocate(fd, 0, bytes); err != 0) {
    ::close(fd);
    if (err == ENOSPC || err == EDQUOT)
      throw Error("less than {} MiB is free in {} for the record '{}' (gpuscope keeps that much aside to close a "
                  "record readable if the disk fills); free some space or choose another place with -o",
                  bytes >> 20, dir.string(), record.string());
    return -1;
  }
  return fd;
}

int on_wal_commit(void* arg, sqlite3*, const char*, int frames) {
  static_cast<std::atomic<uint64_t>*>(arg)->store(uint64_t(frames), std::memory_order_relaxed);
  return SQLITE_OK;
}

constexpr uint64_t kPageSize = 65536;  // create_db's

}  // namespace

size_t RecordWriter::FrameVecHash::operator()(const std::vector<StoredFrame>& v) const {
  size_t h = v.size();
  for (const auto& f : v) h = (h * 1000003) ^ std::hash<uint64_t>{}(f.ip ^ (uint64_t(f.module_id) << 48) ^ f.offset);
  return h;
}

void RecordWriter::prepare_statements() {
  insert_call_ = db_.prepare(
      "INSERT INTO calls(id, ts_ns, duration_ns, pid, tid, func, ret, parent_id, stack_id, stream, ptr, src, bytes, "
      "dir, host_mem, kernel_id, kernel_handle, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem, name, "
      "driver_func, driver_handle, stack_weight, copies) "
      "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24,?25,?26,?27,"
      "?28,?29)");
  insert_nccl_call_ = db_.prepare(
      "INSERT INTO nccl_calls(call_id, comm, count, datatype, op, peer, rank, nranks, comm_id, parent_comm, color, "
      "split_key, group_id) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)");
  insert_kernel_ = db_.prepare("INSERT INTO kernels(id, name, demangled) VALUES(?1, ?2, ?3)");
  rdma_.prepare(db_);
  insert_module_ = db_.prepare("INSERT INTO modules(id, path, build_id) VALUES(?1, ?2, ?3)");
  insert_stack_ = db_.prepare("INSERT INTO stacks(id, depth) VALUES(?1, ?2)");
  insert_frame_ = db_.prepare("INSERT INTO stack_frames(stack_id, depth, module_id, offset, ip) VALUES(?1,?2,?3,?4,?5)");
  upsert_process_ = db_.prepare(
      "INSERT INTO processes(pid, ppid, comm, cmdline, exe, first_seen_ns) VALUES(?1,?2,?3,?4,?5,?6) "
      // A record that arrives after its process has gone (a CPU sample taken during its exit)
      // reads nothing from /proc: it must not blank what was read while the process ran.
      "ON CONFLICT(pid) DO UPDATE SET comm=COALESCE(NULLIF(excluded.comm, ''), processes.comm), "
      "cmdline=COALESCE(NULLIF(excluded.cmdline, ''), processes.cmdline), "
      "exe=COALESCE(NULLIF(excluded.exe, ''), processes.exe), ppid=COALESCE(processes.ppid, excluded.ppid)");
  process_exit_ = db_.prepare("UPDATE processes SET exit_ns=?2, exit_code=?3 WHERE pid=?1");
  upsert_thread_ = db_.prepare("INSERT INTO threads(tid, pid, comm) VALUES(?1,?2,?3) "
      "ON CONFLICT(tid) DO UPDATE SET pid=excluded.pid, comm=excluded.comm");
  insert_library_ = db_.prepare("INSERT INTO libraries(pid, path, build_id, runtime_probes, driver_probes, ts_ns, error) "
      "VALUES(?1,?2,?3,?4,?5,?6,?7)");
  set_lost_ = db_.prepare("INSERT INTO lost(cause, count) VALUES(?1, ?2) "
      "ON CONFLICT(cause) DO UPDATE SET count=excluded.count");
  set_meta_ = db_.prepare("INSERT INTO meta(key, value) VALUES(?1, ?2) "
      "ON CONFLICT(key) DO UPDATE SET value=excluded.value");
  insert_sample_ = db_.prepare("INSERT INTO samples(ts_ns, pid, tid, cpu, stack_id, kernel_stack_id) "
      "VALUES(?1,?2,?3,?4,?5,?6)");
  insert_thread_time_ = db_.prepare(
      "INSERT INTO thread_times(pid, tid, start_ns, end_ns, on_cpu_ns, runnable_ns, io_ns, lock_ns, fd_ns, sleep_ns, "
      "other_ns, waited_ns, waited_for_tid, waited_for_pid, waited_for_comm, blocked_ns, waker_tid, waker_pid, "
      "waker_comm, switches, preempted, faults, state, reclaim_ns, net_softirq_ns, blocked_syscall, blocked_on, sys_ns, "
      "waited_for_kthread) "
      "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24,?25,?26,?27,?28,?29)");
  insert_host_alloc_ = db_.prepare(
      "INSERT INTO host_allocs(ts_ns, pid, tid, op, addr, length, old_addr, stack_id) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)");
  insert_symbol_ = db_.prepare("INSERT OR IGNORE INTO symbols(module_id, offset, name) VALUES(?1,?2,?3)");
  insert_python_frame_ = db_.prepare("INSERT INTO python_frames(id, function, file, line) VALUES(?1,?2,?3,?4)");
  insert_gpu_ = db_.prepare("INSERT OR REPLACE INTO gpus(idx, uuid, name, memory_total, power_limit_mw) "
      "VALUES(?1,?2,?3,?4,?5)");
  insert_gpu_sample_ = db_.prepare(
      "INSERT INTO gpu_samples(ts_ns, gpu, gpu_util, mem_util, mem_used, power_mw, temperature_c, sm_clock_mhz, "
      "mem_clock_mhz, throttle_reasons, pcie_tx_kbs, pcie_rx_kbs, ecc_corrected, ecc_uncorrected, sm_active, "
      "sm_occupancy, tensor_active, dram_active) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18)");
  insert_gpu_process_ = db_.prepare("INSERT INTO gpu_process_samples(ts_ns, gpu, pid, sm_util, mem_util, used_memory) "
      "VALUES(?1,?2,?3,?4,?5,?6)");
  insert_gpu_event_ = db_.prepare("INSERT INTO gpu_events(ts_ns, gpu, kind, value) VALUES(?1,?2,?3,?4)");
  insert_pressure_ = db_.prepare(
      "INSERT INTO pressure(ts_ns, pid, cgroup, cpu_some_us, memory_some_us, memory_full_us, io_some_us, io_full_us, "
      "periods, throttled_periods, throttled_us, refault_file, tcp_out_segs, tcp_retrans_segs) "
      "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14)");
}

RecordWriter::RecordWriter(const std::string& path)
    : path_(checked_output(path).string()),
      temp_{temporary_beside(path_)},
      db_(create_db(temp_.path, path)) {
  try {
    reserve_fd_ = make_reserve(path_, kReserveBytes);
    sqlite3_wal_hook(db_.handle(), on_wal_commit, &wal_frames_);
    prepare_statements();
    // Written now, not with the first batch: a record killed at once must still say what it is.
    db_.exec("BEGIN");
    for (auto [key, value] : {std::pair{"format", std::string(kFormatName)},
                              std::pair{"schema_version", std::to_string(kSchemaVersion)}, std::pair{"complete", std::string("0")}})
      set_meta_.bind(1, key).bind(2, value).run();
    auto fn = db_.prepare("INSERT INTO functions(id, name, api, kind) VALUES(?1,?2,?3,?4)");
    for (const auto& f : cuda::all_functions())
      fn.bind(1, int64_t(f.id)).bind(2, f.symbol).bind(3, cuda::to_string(f.api)).bind(4, cuda::to_string(f.kind)).run();
    db_.exec("COMMIT");
  } catch (const Error& e) {
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
    close_statements();
    temp_.remove = true;  // after db_ is closed (declared after temp_)
    const auto* sql = dynamic_cast<const SqliteError*>(&e);
    if (sql && sql->disk_full())
      throw Error("the disk holding '{}' is full; free some space or choose another place with -o", path_);
    if (sql) throw Error("cannot write the record file '{}': {}; choose a writable path with -o", path_, sql->reason());
    throw;
  }
  writer_ = std::thread([this] {
    name_this_thread("gs-writer");
    write_loop();
  });
}

RecordWriter::~RecordWriter() {
  if (finished_) {
    try {
      seal();
    } catch (...) {
    }
  }
  if (!finished_) {
    try {
      commit();
      stop_writer();
      // A recording under way keeps what it has; one that never began leaves -o as it was.
      if (keep_.load()) place();
    } catch (...) {
    }
    if (!placed_) temp_.remove = true;
  }
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
}

RecordWriter::TempFile::~TempFile() {
  if (remove) remove_db_files(path);
}

void RecordWriter::keep() {
  keep_.store(true);
  cv_.notify_all();
}

void RecordWriter::discard() { keep_.store(false); }

bool RecordWriter::fold(bool one_file) {
  for (int attempt = 0;; ++attempt) {
    try {
      db_.exec("PRAGMA wal_checkpoint(TRUNCATE);");
      // Out of WAL through OFF: the header's switch is written without a -journal, which a
      // kill would leave hot; OFF to DELETE writes nothing.
      if (one_file) db_.exec("PRAGMA journal_mode=OFF; PRAGMA journal_mode=DELETE;");
      return true;
    } catch (const SqliteError& e) {
      if (!e.disk_full()) throw;
      if (attempt > 0 || reserve_fd_ < 0) return false;
      ::close(reserve_fd_);  // what it was kept for
      reserve_fd_ = -1;
    }
  }
}

void RecordWriter::place() {
  if (placed_) return;
  placed_ = true;
  // SQLite refuses to write a database renamed while open (SQLITE_READONLY_DBMOVED): folded
  // into its main file (still in WAL mode: opened again, it writes nothing), closed (the last
  // connection's close removes the log), renamed, and opened again at its place. An earlier
  // record's log files at the place would be read as this one's: they go first. On a disk too
  // full to fold, the log goes along with the file (path-wal), where SQLite reads it.
  const bool folded = fold(false);
  close_statements();
  db_.close();
  std::string at = path_;
  std::error_code ec;
  for (const char* suffix : {"-shm", "-journal", "-wal"}) std::filesystem::remove(path_ + suffix, ec);
  if (std::rename(temp_.path.c_str(), path_.c_str()) != 0) {
    fmt::print(stderr, "gpuscope: error: cannot move the record into place at {}: {}; it is at {}\n", path_,
               std::strerror(errno), temp_.path);
    at = temp_.path;
  } else if (!folded) {
    std::filesystem::rename(temp_.path + "-wal", path_ + "-wal", ec);
    std::filesystem::remove(temp_.path + "-shm", ec);
  }
  db_ = Db(at, Db::Mode::Create);
  configure(db_);
  sqlite3_wal_hook(db_.handle(), on_wal_commit, &wal_frames_);
  prepare_statements();
  last_checkpoint_ns_ = monotonic_ns();
}

void RecordWriter::close_statements() {
  for (Stmt* st : {&insert_call_, &insert_nccl_call_, &insert_kernel_, &insert_module_, &insert_stack_, &insert_frame_, &upsert_process_,
                   &process_exit_, &upsert_thread_, &insert_library_, &set_lost_, &set_meta_, &insert_sample_,
                   &insert_thread_time_, &insert_symbol_, &insert_python_frame_, &insert_gpu_, &insert_gpu_sample_, &insert_gpu_process_,
                   &insert_gpu_event_, &insert_pressure_, &insert_host_alloc_})
    *st = Stmt();
  rdma_.close();
}

void RecordWriter::checkpoint() {
  try {
    if (keep_.load() && !placed_) {
      place();  // with a checkpoint of its own
    } else {
      db_.exec("PRAGMA wal_checkpoint(PASSIVE);");
      last_checkpoint_ns_ = monotonic_ns();
    }
    dirty_ = false;
  } catch (const SqliteError& e) {
    if (e.disk_full()) {
      on_disk_full(Batch{});
      return;
    }
    if (!error_reported_ && placed_) fmt::print(stderr, "gpuscope: error: writing the record failed: {}\n", e.what());
    error_reported_ = error_reported_ || placed_;
  } catch (const std::exception& e) {
    // A reader holds a checkpoint back: the next one folds in more. A failed move is said once.
    if (!error_reported_ && placed_) fmt::print(stderr, "gpuscope: error: writing the record failed: {}\n", e.what());
    error_reported_ = error_reported_ || placed_;
  }
}

void RecordWriter::set_meta(const std::string& key, const std::string& value) {
  std::lock_guard lock(cross_mu_);
  cross_ops_.push_back([this, key, value] { set_meta_.bind(1, key).bind(2, value).run(); });
}

void RecordWriter::add_call(const CallEvent& e) { filling_.calls.push_back(e); }

void RecordWriter::add_sample(uint64_t ts_ns, uint32_t pid, uint32_t tid, uint32_t cpu, int64_t stack_id,
                              int64_t kernel_stack_id) {
  filling_.ops.push_back([=, this] {
    insert_sample_.bind(1, int64_t(ts_ns)).bind(2, int64_t(pid)).bind(3, int64_t(tid)).bind(4, int64_t(cpu));
    if (stack_id) insert_sample_.bind(5, stack_id);
    if (kernel_stack_id) insert_sample_.bind(6, kernel_stack_id);
    insert_sample_.run();
  });
}

void RecordWriter::add_thread_time(const ThreadTimeRow& r) {
  filling_.ops.push_back([r, this] {
    auto& q = insert_thread_time_;
    q.bind(1, int64_t(r.pid)).bind(2, int64_t(r.tid)).bind(3, int64_t(r.start_ns)).bind(4, int64_t(r.end_ns));
    q.bind(5, int64_t(r.on_cpu_ns)).bind(6, int64_t(r.runnable_ns)).bind(7, int64_t(r.io_ns)).bind(8, int64_t(r.lock_ns));
    q.bind(9, int64_t(r.fd_ns)).bind(10, int64_t(r.sleep_ns)).bind(11, int64_t(r.other_ns));
    q.bind(12, int64_t(r.waited_ns));
    if (r.waited_ns) {
      q.bind(13, int64_t(r.waited_for_tid)).bind(14, int64_t(r.waited_for_pid)).bind(15, r.waited_for_comm);
      q.bind(29, int64_t(r.waited_for_kthread));
    }
    q.bind(16, int64_t(r.blocked_ns));
    if (r.blocked_ns) q.bind(17, int64_t(r.waker_tid)).bind(18, int64_t(r.waker_pid)).bind(19, r.waker_comm);
    q.bind(20, int64_t(r.switches)).bind(21, int64_t(r.preempted)).bind(22, int64_t(r.faults)).bind(23, r.state);
    q.bind(24, int64_t(r.reclaim_ns));
    q.bind(25, int64_t(r.net_softirq_ns));
    if (!r.blocked_syscall.empty()) q.bind(26, r.blocked_syscall);
    if (!r.blocked_on.empty()) q.bind(27, r.blocked_on);
    q.bind(28, int64_t(r.sys_ns));
    q.run();
  });
}

void RecordWriter::add_host_alloc(const HostAllocRow& r) {
  filling_.ops.push_back([r, this] {
    auto& q = insert_host_alloc_;
    q.bind(1, int64_t(r.ts_ns)).bind(2, int64_t(r.pid)).bind(3, int64_t(r.tid)).bind(4, r.op);
    q.bind(5, int64_t(r.addr)).bind(6, int64_t(r.length));
    if (r.op == "mremap") q.bind(7, int64_t(r.old_addr));
    if (r.stack_id) q.bind(8, r.stack_id);
    q.run();
  });
}

void RecordWriter::add_rdma(const RdmaEvent& e) {
  filling_.ops.push_back([e, this] { rdma_.insert(e); });
}

void RecordWriter::add_symbol(int64_t module_id, uint64_t offset, const std::string& name) {
  filling_.ops.push_back([=, this] { insert_symbol_.bind(1, module_id).bind(2, int64_t(offset)).bind(3, name).run(); });
}

int64_t RecordWriter::intern_python_frame(const std::string& function, const std::string& file, int line) {
  std::string key = function;
  key += '\0';
  key += file;
  key += '\0';
  key += std::to_string(line);
  if (auto it = python_frames_.find(key); it != python_frames_.end()) return it->second;
  const int64_t id = next_python_frame_id_++;
  filling_.ops.push_back([=, this] { insert_python_frame_.bind(1, id).bind(2, function).bind(3, file).bind(4, line).run(); });
  return python_frames_[key] = id;
}

namespace {
template <class T>
void bind_optional(Stmt& s, int i, const std::optional<T>& v) {
  if (!v)
    s.bind_null(i);
  else if constexpr (std::is_floating_point_v<T>)
    s.bind(i, static_cast<double>(*v));
  else
    s.bind(i, static_cast<int64_t>(*v));
}
}  // namespace

void RecordWriter::add_gpu(const gpu::GpuDevice& d) {
  std::lock_guard lock(cross_mu_);
  cross_ops_.push_back([=, this] {
    insert_gpu_.bind(1, d.index).bind(2, d.uuid).bind(3, d.name).bind(4, d.memory_total).bind(5, d.power_limit_mw).run();
  });
}

void RecordWriter::add_gpu_batch(const gpu::NvmlSampler::Batch& b) {
  filling_.ops.push_back([b, this] {
    for (const auto& s : b.samples) {
      auto& q = insert_gpu_sample_;
      q.bind(1, s.ts_ns).bind(2, s.device);
      bind_optional(q, 3, s.gpu_util);
      bind_optional(q, 4, s.mem_util);
      bind_optional(q, 5, s.mem_used);
      bind_optional(q, 6, s.power_mw);
      bind_optional(q, 7, s.temperature_c);
      bind_optional(q, 8, s.sm_clock_mhz);
      bind_optional(q, 9, s.mem_clock_mhz);
      bind_optional(q, 10, s.throttle_reasons);
      bind_optional(q, 11, s.pcie_tx_kbs);
      bind_optional(q, 12, s.pcie_rx_kbs);
      bind_optional(q, 13, s.ecc_corrected);
      bind_optional(q, 14, s.ecc_uncorrected);
      bind_optional(q, 15, s.sm_active);
      bind_optional(q, 16, s.sm_occupancy);
      bind_optional(q, 17, s.tensor_active);
      bind_optional(q, 18, s.dram_active);
      q.run();
    }
    for (const auto& p : b.processes) {
      auto& q = insert_gpu_process_;
      q.bind(1, p.ts_ns).bind(2, p.device).bind(3, p.pid);
      bind_optional(q, 4, p.sm_util);
      bind_optional(q, 5, p.mem_util);
      bind_optional(q, 6, p.used_memory);
      q.run();
    }
    for (const auto& e : b.events) insert_gpu_event_.bind(1, e.ts_ns).bind(2, e.device).bind(3, e.kind).bind(4, e.value).run();
  });
}

void RecordWriter::add_pressure(const host::PressureReading& r) {
  filling_.ops.push_back([r, this] {
    auto& q = insert_pressure_;
    q.bind(1, r.ts_ns).bind(2, r.pid);
    if (!r.cgroup.empty()) q.bind(3, r.cgroup);
    bind_optional(q, 4, r.cpu_some_us);
    bind_optional(q, 5, r.memory_some_us);
    bind_optional(q, 6, r.memory_full_us);
    bind_optional(q, 7, r.io_some_us);
    bind_optional(q, 8, r.io_full_us);
    bind_optional(q, 9, r.periods);
    bind_optional(q, 10, r.throttled_periods);
    bind_optional(q, 11, r.throttled_us);
    bind_optional(q, 12, r.refault_file);
    bind_optional(q, 13, r.tcp_out_segs);
    bind_optional(q, 14, r.tcp_retrans_segs);
    q.run();
  });
}

void RecordWriter::commit() { push_batch(false); }

void RecordWriter::push_batch(bool last) {
  filling_.last = last;
  {
    std::lock_guard lock(cross_mu_);
    for (auto& op : cross_ops_) filling_.ops.push_back(std::move(op));
    cross_ops_.clear();
  }
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return queue_.size() < kMaxQueuedBatches; });
    queue_.push_back(std::move(filling_));
  }
  cv_.notify_all();
  filling_ = Batch{};
}

void RecordWriter::write_loop() {
  // Signals are for the thread that owns the recording, never this one.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  for (;;) {
    Batch b;
    {
      std::unique_lock lock(mu_);
      // Awake at least once a checkpoint's interval while batches came (a record killed after a
      // quiet while has everything in its main file), and as soon as the record may take its place.
      cv_.wait_for(lock, std::chrono::nanoseconds(kCheckpointNs),
                   [this] { return stopping_ || !queue_.empty() || (keep_.load() && !placed_); });
      if (queue_.empty()) {
        if (stopping_) return;
        lock.unlock();
        if (dirty_ || (keep_.load() && !placed_)) checkpoint();
        continue;
      }
      b = std::move(queue_.front());
      queue_.pop_front();
    }
    cv_.notify_all();
    write_batch(b);
  }
}

void RecordWriter::write_batch(Batch& b) {
  if (disk_full_.load()) return write_after_full(b);
  try {
    db_.exec("BEGIN");
    for (auto& op : b.ops) op();
    for (const auto& e : b.calls) insert_call(e);
    db_.exec("COMMIT");
    dirty_ = true;
    if ((keep_.load() && !placed_) || monotonic_ns() - last_checkpoint_ns_ >= kCheckpointNs ||
        wal_frames_.load(std::memory_order_relaxed) * kPageSize >= kMaxWalBytes)
      checkpoint();
  } catch (const SqliteError& e) {
    if (e.disk_full()) return on_disk_full(b);
    if (!error_reported_) fmt::print(stderr, "gpuscope: error: writing the record failed: {}\n", e.what());
    error_reported_ = true;
    try {
      db_.exec("ROLLBACK");
    } catch (...) {
    }
  } catch (const std::exception& e) {
    if (!error_reported_) fmt::print(stderr, "gpuscope: error: writing the record failed: {}\n", e.what());
    error_reported_ = true;
    try {
      db_.exec("ROLLBACK");
    } catch (...) {
    }
  }
}

void RecordWriter::on_disk_full(const Batch& b) {
  try {
    db_.exec("ROLLBACK");
  } catch (...) {
  }
  calls_dropped_ += b.calls.size();
  if (disk_full_.exchange(true)) return;
  // What was committed goes into the record's one file now (the log's pages are folded into the
  // main file with the reserve's room), at its place if the recording has begun.
  try {
    if (keep_.load() && !placed_)
      place();
    else
      fold(true);
  } catch (const std::exception& e) {
    fmt::print(stderr, "gpuscope: error: closing the record on a full disk failed: {}\n", e.what());
  }
  fmt::print(stderr,
             "gpuscope: warning: the disk holding {} is full: recording stops here; what was recorded until now is "
             "kept (later calls are counted as lost, cause disk_full) and the command runs on\n",
             path_);
}

void RecordWriter::write_after_full(Batch& b) {
  calls_dropped_ += b.calls.size();
  if (!b.last) return;
  // The record's end: its metadata and lost counters (rows in pages it already has, mostly),
  // without the calls and samples that came after the disk filled.
  try {
    db_.exec("BEGIN");
    for (auto& op : b.ops) op();
    db_.exec("COMMIT");
  } catch (const std::exception&) {
    try {
      db_.exec("ROLLBACK");
    } catch (...) {
    }
  }
  try {
    set_lost_.bind(1, "disk_full").bind(2, int64_t(calls_dropped_)).run();
    set_meta_.bind(1, "disk_full").bind(2, "1").run();
  } catch (const std::exception&) {
  }
}

void RecordWriter::stop_writer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void RecordWriter::insert_call(const CallEvent& e) {
  auto& s = insert_call_;
  auto opt = [&](int i, uint64_t v) {
    if (v) s.bind(i, v); else s.bind_null(i);
  };
  const auto* f = cuda::function_by_id(e.func);
  const bool launch = f && f->kind == cuda::CallKind::Launch;
  s.bind(1, e.call_id).bind(2, e.ts_ns);
  if (e.has_return) s.bind(3, e.duration_ns).bind(7, e.ret);
  s.bind(4, e.pid).bind(5, e.tid).bind(6, int64_t(e.func));
  opt(8, e.parent_id);
  opt(9, e.stack_id);
  opt(10, e.stream);
  opt(11, e.ptr);
  opt(12, e.src);
  // NULL where the size could not be told (a copy in the elements of an array not seen created).
  if (e.bytes_known && (e.bytes || (f && (f->kind == cuda::CallKind::Memcpy || f->kind == cuda::CallKind::Alloc))))
    s.bind(13, e.bytes);
  if (f && f->kind == cuda::CallKind::Memcpy) {
    s.bind(14, cuda::to_string(e.dir));
    if (e.host_mem != HostMem::NotApplicable) s.bind(15, to_string(e.host_mem));
  }
  opt(16, e.kernel_id);
  opt(17, e.kernel_handle);
  if (launch) {
    s.bind(18, e.grid[0]).bind(19, e.grid[1]).bind(20, e.grid[2]);
    s.bind(21, e.block[0]).bind(22, e.block[1]).bind(23, e.block[2]).bind(24, e.shared_mem);
  }
  if (!e.name.empty()) s.bind(25, e.name);
  if (e.driver_func) s.bind(26, int64_t(e.driver_func)).bind(27, e.driver_handle);
  if (e.stack_weight != 1) s.bind(28, int64_t(e.stack_weight));
  if (e.copies) s.bind(29, int64_t(e.copies));
  s.run();
  if (e.nccl && f) insert_nccl_call(e, *f);
}

void RecordWriter::insert_nccl_call(const CallEvent& e, const cuda::FunctionSpec& f) {
  using enum cuda::CallKind;
  const NcclArgs& n = *e.nccl;
  auto& s = insert_nccl_call_;
  s.bind(1, e.call_id);
  if (n.comm) s.bind(2, n.comm);
  if (f.kind == Collective || f.kind == PeerToPeer) {
    s.bind(3, n.count);
    if (const auto t = decode::nccl_datatype_name(n.datatype); !t.empty()) s.bind(4, t);
    else s.bind(4, fmt::format("{}", n.datatype));
    if (const auto op = decode::nccl_op_name(n.op); !op.empty()) s.bind(5, op);
    if (n.peer >= 0) s.bind(6, int64_t(n.peer));
  }
  if (n.rank >= 0) s.bind(7, int64_t(n.rank));
  if (n.nranks >= 0) s.bind(8, int64_t(n.nranks));
  if (n.id_hash) s.bind(9, fmt::format("{:016x}", n.id_hash));
  if (f.sig == cuda::Signature::NcclCommSplit) s.bind(10, n.parent).bind(11, int64_t(n.color)).bind(12, int64_t(n.key));
  if (n.group) s.bind(13, n.group);
  s.run();
}

int64_t RecordWriter::intern_kernel(const std::string& name, const std::string& demangled) {
  if (auto it = kernels_.find(name); it != kernels_.end()) return it->second;
  const int64_t id = next_kernel_id_++;
  filling_.ops.push_back([this, id, name, demangled] { insert_kernel_.bind(1, id).bind(2, name).bind(3, demangled).run(); });
  return kernels_[name] = id;
}

int64_t RecordWriter::intern_module(const std::string& path, const std::string& build_id) {
  const std::string key = path + '\0' + build_id;
  if (auto it = modules_.find(key); it != modules_.end()) return it->second;
  const int64_t id = next_module_id_++;
  filling_.ops.push_back([this, id, path, build_id] { insert_module_.bind(1, id).bind(2, path).bind(3, build_id).run(); });
  return modules_[key] = id;
}

int64_t RecordWriter::intern_stack(const std::vector<StoredFrame>& frames) {
  if (auto it = stacks_.find(frames); it != stacks_.end()) return it->second;
  const int64_t id = next_stack_id_++;
  filling_.ops.push_back([this, id, frames] {
    insert_stack_.bind(1, id).bind(2, int64_t(frames.size())).run();
    for (size_t d = 0; d < frames.size(); ++d) {
      const auto& f = frames[d];
      insert_frame_.bind(1, id).bind(2, int64_t(d));
      if (f.module_id) insert_frame_.bind(3, f.module_id).bind(4, f.offset);
      insert_frame_.bind(5, f.ip).run();
    }
  });
  stacks_.emplace(frames, id);
  return id;
}

void RecordWriter::upsert_process(uint32_t pid, uint32_t ppid, const std::string& comm, const std::string& cmdline,
                                  const std::string& exe, uint64_t ts_ns) {
  filling_.ops.push_back([=, this] {
    upsert_process_.bind(1, pid);
    if (ppid) upsert_process_.bind(2, ppid);
    upsert_process_.bind(3, comm).bind(4, cmdline).bind(5, exe).bind(6, ts_ns).run();
  });
}

void RecordWriter::set_process_exit(uint32_t pid, uint64_t ts_ns, int exit_code) {
  filling_.ops.push_back([=, this] { process_exit_.bind(1, pid).bind(2, ts_ns).bind(3, exit_code).run(); });
}

void RecordWriter::upsert_thread(uint32_t tid, uint32_t pid, const std::string& comm) {
  filling_.ops.push_back([=, this] { upsert_thread_.bind(1, tid).bind(2, pid).bind(3, comm).run(); });
}

void RecordWriter::add_library(const LibraryRow& l) {
  filling_.ops.push_back([this, l] {
    insert_library_.bind(1, l.pid).bind(2, l.path).bind(3, l.build_id).bind(4, l.runtime_probes);
    insert_library_.bind(5, l.driver_probes).bind(6, l.ts_ns);
    if (!l.error.empty()) insert_library_.bind(7, l.error);
    insert_library_.run();
  });
}

void RecordWriter::set_lost(const std::string& cause, uint64_t count) {
  filling_.ops.push_back([=, this] { set_lost_.bind(1, cause).bind(2, count).run(); });
}

void RecordWriter::finish(bool seal_later) {
  set_meta("complete", "1");
  push_batch(true);
  stop_writer();
  finished_ = true;
  place();
  // Indexes are a convenience for readers: on a full disk the record goes without them.
  if (!disk_full_.load()) {
    try {
      db_.exec(kIndexSql);
    } catch (const SqliteError& e) {
      if (!e.disk_full()) throw;
      disk_full_.store(true);
      fmt::print(stderr, "gpuscope: warning: the disk holding {} filled at the end of the recording: the record "
                 "goes without its indexes (reading it is slower)\n", path_);
    }
  }
  if (!seal_later) seal();
}

void RecordWriter::seal() {
  if (!finished_ || sealed_) return;
  sealed_ = true;
  // Back to a single file: a record is something people copy around.
  if (!fold(true))
    fmt::print(stderr, "gpuscope: warning: the disk holding {} is too full to fold the record into one file: its "
               "end is in {}-wal, which must stay beside it\n", path_, path_);
  if (reserve_fd_ >= 0) {
    ::close(reserve_fd_);
    reserve_fd_ = -1;
  }
}

}  // namespace gpuscope::store
