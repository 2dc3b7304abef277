// The BPF stack walker's tables (--call-stacks eh-frame, --sample-unwind eh-frame): each file a
// target maps executable is compiled once (symbolize::compile_unwind_table) into a range of the
// shared row array, whatever the number of processes that map it; each process gets a sorted
// table of its executable mappings naming their ranges. Memory is bounded by the array's size:
// tables no process uses are evicted first, and a file that still does not fit is walked with
// frame pointers (counted). Used by one thread (the tracer's control loop).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "attach/bpf_session.h"
#include "common/clock.h"
#include "symbolize/unwind_table.h"

namespace gpuscope::record {

class UnwindTables {
 public:
  // cache_dir: compiled tables kept between runs (symbolize::load_unwind_table); empty: none.
  UnwindTables(attach::BpfSession& bpf, std::string cache_dir) : bpf_(bpf), cache_dir_(std::move(cache_dir)) {}

  // Reads the process's executable mappings, loads the tables it lacks and gives the BPF side
  // its mapping table. False if the process is gone.
  bool update(pid_t pid);
  // Lets go of a process (exited): its files' tables may be evicted from now on.
  void forget(pid_t pid);
  // The processes the BPF side asked about (no table yet, or code outside their mappings),
  // updated at most once a second each.
  void update_wanted();
  // Updates the process again at an update_wanted a poll or more later: it was just stopped at a
  // library's load and will map more (the C library after the CUDA runtime, when the program
  // links both).
  void update_soon(pid_t pid) { soon_.try_emplace(pid, monotonic_ns()); }

  struct Stats {
    size_t files = 0;              // tables loaded
    uint64_t rows_used = 0, rows_capacity = 0;  // row slots (8 bytes), index included
    uint64_t compile_ns = 0;       // spent compiling, in all (wall time: files compile in parallel)
    uint64_t files_compiled = 0;
    uint64_t files_from_cache = 0;  // of those, read back from the cache instead
    uint64_t files_without_room = 0;  // walked with frame pointers: the array was full
    uint64_t files_failed = 0;     // unreadable, or no frame information
    uint64_t evicted = 0;
    uint64_t updates = 0;          // a process's mappings read (at its start, a new library, a walk in none)
    size_t processes = 0;
  };
  Stats stats() const;

 private:
  using FileKey = std::tuple<uint64_t, uint64_t, int64_t>;  // st_dev, st_ino, mtime (ns)
  struct File {
    std::string path;
    uint64_t base = 0;
    std::vector<symbolize::UnwindTable::Segment> segments;
    uint32_t off = 0, len = 0;  // rows in the array; len 0: none (frame pointers)
    uint32_t slots = 0;         // what the table holds of the array: rows, then their index
    uint32_t index_len = 0, index_shift = 0;
    int refs = 0;
    uint64_t last_used = 0;
  };
  struct Process {
    std::vector<FileKey> files;
    uint64_t updated_ns = 0;
    uint64_t wanted_ns = 0;  // last updated because the BPF side asked
    std::vector<gs_unwind_mapping> maps;
  };
  // The file's table, compiled here unless `compiled` holds it (moved from).
  File* load(const FileKey& key, const std::string& path, symbolize::UnwindTable* compiled = nullptr);
  bool allocate(uint32_t n, uint32_t& off);
  void release(uint32_t off, uint32_t n);
  bool evict_one();

  attach::BpfSession& bpf_;
  std::string cache_dir_;
  std::map<pid_t, uint64_t> soon_;  // update_soon's processes, and when they were named
  std::map<FileKey, File> files_;
  std::map<pid_t, Process> procs_;
  std::map<uint32_t, uint32_t> free_;  // free row ranges: offset -> length
  uint32_t top_ = 0;                   // rows below it have been handed out at some point
  uint64_t clock_ = 0;
  uint32_t generation_ = 0;  // gs_unwind_proc::gen: one counter for all, so that no two entries share one
  Stats stats_;
};

}  // namespace gpuscope::record
