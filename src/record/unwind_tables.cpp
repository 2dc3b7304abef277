#include "record/unwind_tables.h"

#include <libelf.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "discover/proc.h"

namespace gpuscope::record {
namespace {

constexpr uint64_t kWantedIntervalNs = 1'000'000'000;
// update_soon: long enough for the dynamic loader to map the rest of a program's libraries
// once the process is resumed, short beside the control loop's 100 ms poll.
constexpr uint64_t kSoonNs = 20'000'000;

}  // namespace

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
    if (it->second.refs == 0 && (victim == files_.end() || it->second.last_used < victim->second.last_used))
      victim = it;
  if (victim == files_.end()) return false;
  if (victim->second.len) release(victim->second.off, victim->second.slots);
  files_.erase(victim);
  ++stats_.evicted;
  return true;
}

namespace {

symbolize::CachedTable compile_or_empty(const std::string& path, const std::string& cache_dir) {
  try {
    return symbolize::load_unwind_table(path, cache_dir);
  } catch (const std::exception& e) {
    log_debug("no unwind table for {}: {}", path, e.what());
    return {};
  }
}

}  // namespace

UnwindTables::File* UnwindTables::load(const FileKey& key, const std::string& path,
                                       symbolize::UnwindTable* compiled) {
  if (auto it = files_.find(key); it != files_.end()) return &it->second;
  File f;
  f.path = path;
  symbolize::UnwindTable t;
  if (compiled) {
    t = std::move(*compiled);
  } else {
    const uint64_t t0 = monotonic_ns();
    auto c = compile_or_empty(path, cache_dir_);
    t = std::move(c.table);
    stats_.files_from_cache += c.from_cache;
    stats_.compile_ns += monotonic_ns() - t0;
  }
  ++stats_.files_compiled;
  f.base = t.base;
  f.segments = t.segments;
  if (t.rows.empty()) {
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
      f.off = off;
      f.len = static_cast<uint32_t>(t.rows.size());
      f.slots = n;
      f.index_len = static_cast<uint32_t>(t.index.size());
      f.index_shift = t.index_shift;
      log_debug("unwind table for {}: {} rows and {} index entries at {}", path, f.len, f.index_len, off);
    } else {
      ++stats_.files_without_room;
      log_debug("no room for the {} unwind rows of {}", n, path);
    }
  }
  return &files_.emplace(key, std::move(f)).first->second;
}

bool UnwindTables::update(pid_t pid) {
  if (!bpf_.unwind_tables_enabled()) return false;
  auto maps = discover::read_maps(pid);
  if (maps.empty()) return false;
  ++stats_.updates;
  Process next;
  next.updated_ns = monotonic_ns();
  // The files the mappings hold, even if their paths now name others (an upgraded library).
  struct Mapped {
    const discover::Mapping* m;
    FileKey key;
    std::string path;
  };
  std::vector<Mapped> mapped;
  for (const auto& m : maps) {
    if (!m.executable || m.path.empty() || m.path[0] != '/') continue;
    if (mapped.size() >= GS_UNWIND_MAX_MAPPINGS) break;
    std::string path = fmt::format("/proc/{}/map_files/{:x}-{:x}", pid, m.start, m.end);
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) continue;
    mapped.push_back({&m, {st.st_dev, st.st_ino, int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec},
                      std::move(path)});
  }
  // New files are compiled on several threads: a PyTorch process maps ~80 (10 s on one core).
  std::map<FileKey, symbolize::UnwindTable> compiled;
  {
    std::vector<const Mapped*> todo;
    for (const auto& x : mapped)
      if (!files_.count(x.key) && compiled.emplace(x.key, symbolize::UnwindTable{}).second) todo.push_back(&x);
    const uint64_t t0 = monotonic_ns();
    elf_version(EV_CURRENT);  // libelf's one global, set before the threads use it
    const size_t workers = std::min<size_t>(todo.size(), std::max(1u, std::thread::hardware_concurrency()));
    std::vector<symbolize::CachedTable> tables(todo.size());
    std::atomic<size_t> next_file{0};
    auto work = [&] {
      for (size_t i; (i = next_file++) < todo.size();) tables[i] = compile_or_empty(todo[i]->path, cache_dir_);
    };
    std::vector<std::thread> pool;
    for (size_t w = 1; w < workers; ++w) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (size_t i = 0; i < todo.size(); ++i) {
      stats_.files_from_cache += tables[i].from_cache;
      compiled[todo[i]->key] = std::move(tables[i].table);
    }
    if (!todo.empty()) stats_.compile_ns += monotonic_ns() - t0;  // wall time
  }
  for (const auto& [mp, key, path] : mapped) {
    const auto& m = *mp;
    auto pre = compiled.find(key);
    File* f = load(key, path, pre != compiled.end() ? &pre->second : nullptr);
    f->last_used = ++clock_;
    ++f->refs;  // at once: loading the next file must not evict this one
    next.files.push_back(key);
    gs_unwind_mapping um{};
    um.start = m.start;
    um.end = m.end;
    um.table_off = f->off;
    um.table_len = f->len;
    um.index_len = f->index_len;
    um.index_shift = f->index_shift;
    // ip - pc_delta = the file vaddr of ip, minus the table's base.
    bool found = false;
    for (const auto& s : f->segments)
      if (m.offset >= s.offset && m.offset < s.offset + s.filesz) {
        um.pc_delta = m.start - (m.offset - s.offset + s.vaddr) + f->base;
        found = true;
        break;
      }
    if (!found) um.table_len = 0;
    next.maps.push_back(um);
  }
  std::sort(next.maps.begin(), next.maps.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  auto old = procs_.find(pid);
  if (old != procs_.end())
    for (const auto& k : old->second.files)
      if (auto it = files_.find(k); it != files_.end()) --it->second.refs;
  const bool same = old != procs_.end() && old->second.maps.size() == next.maps.size() &&
                    std::equal(next.maps.begin(), next.maps.end(), old->second.maps.begin(),
                               [](const auto& a, const auto& b) { return !std::memcmp(&a, &b, sizeof(a)); });
  if (!same) {
    auto proc = std::make_unique<gs_unwind_proc>();
    std::memset(proc.get(), 0, sizeof(*proc));
    proc->nr = static_cast<uint32_t>(next.maps.size());
    proc->gen = ++generation_;
    std::copy(next.maps.begin(), next.maps.end(), proc->maps);
    if (!bpf_.set_unwind_process(pid, *proc)) log_debug("no room for PID {}'s unwind table", pid);
  }
  procs_[pid] = std::move(next);
  return true;
}

void UnwindTables::forget(pid_t pid) {
  auto it = procs_.find(pid);
  if (it == procs_.end()) return;
  for (const auto& k : it->second.files)
    if (auto f = files_.find(k); f != files_.end()) --f->second.refs;
  procs_.erase(it);
  bpf_.remove_unwind_process(pid);
}

void UnwindTables::update_wanted() {
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
  s.files = files_.size();
  s.processes = procs_.size();
  s.rows_capacity = bpf_.unwind_rows_capacity();
  for (const auto& [k, f] : files_) s.rows_used += f.slots;
  return s;
}

}  // namespace gpuscope::record
