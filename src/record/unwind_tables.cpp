#include "record/unwind_tables.h"

#include <fcntl.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/clock.h"
#include "common/log.h"
#include "discover/proc.h"
#include "discover/python.h"

namespace gpuscope::record {
namespace {

constexpr uint64_t kWantedIntervalNs = 1'000'000'000;
// update_soon: long enough for the dynamic loader to map the rest of a program's libraries
// once the process is resumed, short beside the control loop's 100 ms poll.
constexpr uint64_t kSoonNs = 20'000'000;

// Files in nearly every stack of a CUDA process, compiled as soon as it is seen rather than at
// its first walk: the executable (main, and a CUDA runtime linked into it), the C library (the
// program's and threads' start), the C++ library (std::thread's start), the CUDA runtime (every
// runtime call's frames) and the Python interpreter. All small: a few ms each, 0.2 ms read back
// from the cache (bench/unwind_tables).
bool needed_at_once(const std::string& path, const std::string& exe) {
  if (path == exe) return true;
  const std::string base = std::filesystem::path(path).filename();
  return base.starts_with("libc.so") || base.starts_with("libc-") || base.starts_with("libstdc++.so") ||
         discover::is_cuda_runtime_library(path) || discover::looks_like_python(path);
}

// The workers: compiling is CPU-bound and the program being traced needs the CPUs more.
unsigned worker_count() { return std::clamp(std::thread::hardware_concurrency() / 4, 1u, 4u); }

}  // namespace

UnwindTables::UnwindTables(attach::BpfSession& bpf, std::string cache_dir, std::function<void()> wake)
    : bpf_(bpf), cache_dir_(std::move(cache_dir)), wake_(std::move(wake)) {}

UnwindTables::~UnwindTables() { stop_workers(); }

void UnwindTables::stop_workers() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    for (const auto& j : jobs_) close(j.fd);
    jobs_.clear();
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void UnwindTables::settle() {
  stop_workers();
  std::vector<Done> done;
  {
    std::lock_guard lock(mu_);
    done.swap(done_);
  }
  for (auto& d : done) install(d);
}

bool UnwindTables::allocate(uint32_t n, uint32_t& off) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    off = it->first;
    const uint32_t rest = it->second - n;
    free_.erase(it);
    if (rest) free_.emplace(off + n, rest);
    return true;
  }
  if (uint64_t(top_) + n > bpf_.unwind_rows_capacity()) return false;
  off = top_;
  top_ += n;
  return true;
}

void UnwindTables::release(uint32_t off, uint32_t n) {
  auto [it, inserted] = free_.emplace(off, n);
  // Joined with its neighbours, so that a big table fits again where small ones were.
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
      it = prev;
    }
  }
  if (it->first + it->second == top_) {  // back to never handed out
    top_ = it->first;
    free_.erase(it);
  }
}

// The least recently used table no process maps.
bool UnwindTables::evict_one() {
  auto victim = files_.end();
  for (auto it = files_.begin(); it != files_.end(); ++it)
    if (it->second.state == State::Loaded && it->second.refs == 0 &&
        (victim == files_.end() || it->second.last_used < victim->second.last_used))
      victim = it;
  if (victim == files_.end()) return false;
  release(victim->second.off, victim->second.slots);
  files_.erase(victim);
  ++stats_.evicted;
  return true;
}

void UnwindTables::start_compile(pid_t pid, const Mapped& m, File& f, bool cached_only) {
  // Opened now: the worker may get to it after the process has unmapped it or exited.
  const std::string path = fmt::format("/proc/{}/map_files/{:x}-{:x}", pid, m.start, m.end);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    log_debug("no unwind table for {}: {}", f.path, strerror(errno));
    f.state = State::None;
    ++stats_.files_failed;
    return;
  }
  f.state = cached_only ? State::Probing : State::Compiling;
  queue(m.key, fd, cached_only);
}

void UnwindTables::queue(const FileKey& key, int fd, bool cached_only) {
  {
    std::lock_guard lock(mu_);
    if (stop_) {  // settled: no more tables for this recording
      close(fd);
      files_.at(key).state = State::None;
      return;
    }
    jobs_.push_back({key, fd, cached_only});
    if (workers_.size() < worker_count()) {
      elf_version(EV_CURRENT);  // libelf's one global, set before the threads use it
      workers_.emplace_back([this] { worker(); });
    }
  }
  cv_.notify_one();
}

void UnwindTables::worker() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = jobs_.front();
      jobs_.pop_front();
    }
    const uint64_t t0 = monotonic_ns();
    Done d{job.key, {}, true, 0};
    const std::string path = fmt::format("/proc/self/fd/{}", job.fd);
    try {
      if (!job.cached_only) {
        d.table = symbolize::load_unwind_table(path, cache_dir_, &stop_);
      } else if (auto t = symbolize::load_cached_unwind_table(path, cache_dir_)) {
        d.table = {std::move(*t), true};
      } else {
        d.ok = false;
        d.fd = job.fd;  // not in the cache: compiled if a walk needs it after all
      }
    } catch (const std::exception& e) {
      log_debug("no unwind table: {}", e.what());
      d.ok = false;
    }
    if (d.fd < 0) close(job.fd);
    d.ns = monotonic_ns() - t0;
    if (!d.ok && stop_) {  // cancelled
      if (d.fd >= 0) close(d.fd);
      return;
    }
    {
      std::lock_guard lock(mu_);
      done_.push_back(std::move(d));
    }
    if (wake_) wake_();
  }
}

void UnwindTables::install(Done& d) {
  auto it = files_.find(d.key);
  if (it == files_.end()) return;  // evicted meanwhile: cannot be, but nothing to do
  File& f = it->second;
  if (d.fd >= 0) {  // a cache probe that found nothing
    if (f.on_demand) {  // a walk asked meanwhile
      f.state = State::Compiling;
      queue(d.key, d.fd, false);
    } else {
      close(d.fd);
      f.state = State::Lazy;
    }
    return;
  }
  const symbolize::UnwindTable& t = d.table.table;
  ++stats_.files_compiled;
  stats_.files_from_cache += d.table.from_cache;
  stats_.compile_ns += d.ns;
  (f.on_demand ? stats_.files_on_demand : stats_.files_at_sight)++;
  if (f.on_demand) stats_.demand_wait_max_ns = std::max(stats_.demand_wait_max_ns, monotonic_ns() - f.requested_ns);
  f.state = State::None;
  f.base = t.base;
  f.segments = t.segments;
  if (!d.ok || t.rows.empty()) {
    ++stats_.files_failed;
  } else if (t.slots() > bpf_.unwind_rows_capacity()) {
    ++stats_.files_without_room;
  } else {
    const auto n = static_cast<uint32_t>(t.slots());
    uint32_t off = 0;
    bool ok = allocate(n, off);
    while (!ok && evict_one()) ok = allocate(n, off);
    if (ok) {
      // Written before any process's mapping table names these rows (an update of that map
      // is a system call: the BPF side sees the rows complete). The index follows the rows,
      // two entries a slot (an odd count leaves the last slot's high half 0).
      gs_unwind_row* dst = bpf_.unwind_rows() + off;
      std::memcpy(dst, t.rows.data(), t.rows.size() * sizeof(gs_unwind_row));
      std::memset(dst + t.rows.size(), 0, (n - t.rows.size()) * sizeof(gs_unwind_row));
      std::memcpy(dst + t.rows.size(), t.index.data(), t.index.size() * sizeof(uint32_t));
      f.state = State::Loaded;
      f.off = off;
      f.len = static_cast<uint32_t>(t.rows.size());
      f.slots = n;
      f.index_len = static_cast<uint32_t>(t.index.size());
      f.index_shift = t.index_shift;
      f.last_used = ++clock_;
      log_debug("unwind table for {}: {} rows and {} index entries at {}, {:.1f} ms{}", f.path, f.len, f.index_len,
                off, d.ns / 1e6, d.table.from_cache ? " (cache)" : "");
    } else {
      ++stats_.files_without_room;
      log_debug("no room for the {} unwind rows of {}", n, f.path);
    }
  }
  for (auto& [pid, p] : procs_)
    if (std::any_of(p.maps.begin(), p.maps.end(), [&](const Mapped& m) { return m.key == d.key; })) publish(pid, p);
}

void UnwindTables::publish(pid_t pid, Process& p) {
  std::vector<gs_unwind_mapping> maps;
  maps.reserve(p.maps.size());
  for (const auto& m : p.maps) {
    const File& f = files_.at(m.key);
    gs_unwind_mapping um{};
    um.start = m.start;
    um.end = m.end;
    if (f.state == State::Lazy || f.state == State::Probing || f.state == State::Compiling) {
      um.flags = GS_UNWIND_MAP_PENDING;
    } else if (f.state == State::Loaded) {
      // ip - pc_delta = the file vaddr of ip, minus the table's base.
      for (const auto& s : f.segments)
        if (m.offset >= s.offset && m.offset < s.offset + s.filesz) {
          um.pc_delta = m.start - (m.offset - s.offset + s.vaddr) + f.base;
          um.table_off = f.off;
          um.table_len = f.len;
          um.index_len = f.index_len;
          um.index_shift = static_cast<uint16_t>(f.index_shift);
          break;
        }
    }
    maps.push_back(um);
  }
  if (maps.size() == p.sent.size() &&
      std::equal(maps.begin(), maps.end(), p.sent.begin(),
                 [](const auto& a, const auto& b) { return !std::memcmp(&a, &b, sizeof(a)); }))
    return;
  auto proc = std::make_unique<gs_unwind_proc>();
  std::memset(proc.get(), 0, sizeof(*proc));
  proc->nr = static_cast<uint32_t>(maps.size());
  proc->gen = ++generation_;
  std::copy(maps.begin(), maps.end(), proc->maps);
  if (!bpf_.set_unwind_process(pid, *proc)) log_debug("no room for PID {}'s unwind table", pid);
  p.sent = std::move(maps);
}

bool UnwindTables::update(pid_t pid) {
  if (!bpf_.unwind_tables_enabled()) return false;
  const uint64_t t0 = monotonic_ns();
  auto maps = discover::read_maps(pid);
  if (maps.empty()) return false;
  ++stats_.updates;
  const std::string exe = discover::read_exe(pid);
  Process next;
  next.updated_ns = monotonic_ns();
  std::vector<std::pair<Mapped, std::string>> mapped;  // and the path the process sees
  for (const auto& m : maps) {
    if (!m.executable || m.path.empty() || m.path[0] != '/') continue;
    if (mapped.size() >= GS_UNWIND_MAX_MAPPINGS) break;
    // The file the mapping holds, even if its path now names another (an upgraded library).
    const std::string path = fmt::format("/proc/{}/map_files/{:x}-{:x}", pid, m.start, m.end);
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) continue;
    mapped.push_back({{m.start, m.end, m.offset,
                       {st.st_dev, st.st_ino, int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec}},
                      m.path});
  }
  for (auto& [m, path] : mapped) {
    auto [it, added] = files_.try_emplace(m.key);
    File& f = it->second;
    if (added) {
      f.path = path;
      // The others are read back at once if the cache has them: a walk of an earlier run needed
      // them, as one will most likely need them again.
      start_compile(pid, m, f, !needed_at_once(path, exe) && !cache_dir_.empty());
    }
    f.last_used = ++clock_;
    ++f.refs;  // before any install can evict it
    next.maps.push_back(m);
  }
  std::sort(next.maps.begin(), next.maps.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  auto old = procs_.find(pid);
  if (old != procs_.end()) {
    for (const auto& m : old->second.maps)
      if (auto it = files_.find(m.key); it != files_.end()) --it->second.refs;
    next.wanted_ns = old->second.wanted_ns;
    next.sent = std::move(old->second.sent);
  }
  auto& p = procs_[pid] = std::move(next);
  publish(pid, p);
  stats_.update_ns += monotonic_ns() - t0;
  return true;
}

void UnwindTables::forget(pid_t pid) {
  auto it = procs_.find(pid);
  if (it == procs_.end()) return;
  for (const auto& m : it->second.maps) {
    auto f = files_.find(m.key);
    if (f == files_.end() || --f->second.refs > 0) continue;
    // Nothing worth keeping of a file without a table that no process maps (an agent sees
    // files come and go for weeks): a table stays, for the next process that maps the file.
    if (f->second.state == State::Lazy || f->second.state == State::None) {
      stats_.files_never_needed += f->second.state == State::Lazy;
      files_.erase(f);
    }
  }
  procs_.erase(it);
  bpf_.remove_unwind_process(pid);
}

void UnwindTables::demand(pid_t pid, Process& p, const Mapped& m, uint64_t now) {
  File& f = files_.at(m.key);
  if (f.state == State::Probing && !f.on_demand) {  // compiled when the probe finds no table
    f.on_demand = true;
    f.requested_ns = now;
  }
  if (f.state != State::Lazy) return;
  f.on_demand = true;
  f.requested_ns = now;
  start_compile(pid, m, f);
  if (f.state == State::None) publish(pid, p);  // could not even be opened
}

// The files walks needed while their tables were pending: compiled now. A walk may ask again
// before the table is in place, which costs it a failed map insert.
void UnwindTables::serve_file_requests() {
  const uint64_t now = monotonic_ns();
  for (const auto& want : bpf_.unwind_files_wanted()) {
    bpf_.clear_unwind_file_wanted(want);
    auto p = procs_.find(static_cast<pid_t>(want.tgid));
    if (p == procs_.end()) continue;  // gone, or not one whose tables are kept
    for (const auto& m : p->second.maps)
      if (m.start == want.start) demand(p->first, p->second, m, now);
  }
}

void UnwindTables::note_frames(pid_t pid, const std::vector<uint64_t>& ips) {
  bool first;
  {
    std::lock_guard lock(mu_);
    first = frames_.empty();
    for (uint64_t ip : ips)
      if (frames_.size() < 65536) frames_.emplace_back(pid, ip);
  }
  if (first && wake_) wake_();
}

void UnwindTables::serve_noted_frames() {
  std::vector<std::pair<pid_t, uint64_t>> frames;
  {
    std::lock_guard lock(mu_);
    frames.swap(frames_);
  }
  const uint64_t now = monotonic_ns();
  for (const auto& [pid, ip] : frames) {
    auto p = procs_.find(pid);
    if (p == procs_.end()) continue;
    const auto& maps = p->second.maps;
    auto m = std::upper_bound(maps.begin(), maps.end(), ip, [](uint64_t a, const Mapped& x) { return a < x.start; });
    if (m != maps.begin() && ip < (--m)->end) demand(pid, p->second, *m, now);
  }
}

void UnwindTables::update_wanted() {
  std::vector<Done> done;
  {
    std::lock_guard lock(mu_);
    done.swap(done_);
  }
  for (auto& d : done) install(d);
  serve_noted_frames();
  serve_file_requests();
  const uint64_t now = monotonic_ns();
  for (auto it = soon_.begin(); it != soon_.end();) {
    if (now - it->second < kSoonNs) {
      ++it;
      continue;
    }
    if (procs_.count(it->first) && !update(it->first)) forget(it->first);
    it = soon_.erase(it);
  }
  for (pid_t pid : bpf_.unwind_wanted()) {
    auto it = procs_.find(pid);
    // A process walking through code of no file (JIT) asks again and again: once a second. The
    // first request is answered at once (a library mapped just after the tables were made at
    // the process's first CUDA library: the C library, when the runtime is loaded before it).
    const uint64_t last_asked = it != procs_.end() ? it->second.wanted_ns : 0;
    if (last_asked && now - last_asked < kWantedIntervalNs) continue;
    if (update(pid)) {
      procs_[pid].wanted_ns = now;
    } else {
      forget(pid);
    }
    bpf_.clear_unwind_wanted(pid);
  }
}

UnwindTables::Stats UnwindTables::stats() const {
  Stats s = stats_;
  s.processes = procs_.size();
  s.rows_capacity = bpf_.unwind_rows_capacity();
  for (const auto& [k, f] : files_) {
    if (f.state == State::Loaded) {
      ++s.files;
      s.rows_used += f.slots;
    }
    s.files_never_needed += f.state == State::Lazy;
  }
  return s;
}

}  // namespace gpuscope::record
