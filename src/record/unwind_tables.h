// The BPF stack walker's tables (--call-stacks eh-frame, the default, and --sample-unwind
// eh-frame): each file a target maps executable is compiled once (symbolize::load_unwind_table,
// which keeps compiled tables by build id between runs) into a range of the shared row array,
// whatever the number of processes that map it; each process gets a sorted table of its
// executable mappings naming their ranges.
//
// Tables are made when they are needed, never while a process waits: a process's executable,
// C and C++ libraries, CUDA runtime and Python interpreter as soon as it is seen (they are in
// nearly every stack, and small), and the files whose tables the cache holds (a walk of an
// earlier run needed them); every other file when a walk first needs it (a PyTorch process maps
// ~80 files, a few of which are ever in its stacks). Files compile on worker threads; until a
// call's walk has the tables it needs, the BPF side sends a copy of its stack instead, which
// user space unwinds from .eh_frame (bpf/events.h: GS_UNWIND_MAP_PENDING), so stacks are whole
// from the first call.
//
// Memory is bounded by the array's size: tables no process uses are evicted first, and a file
// that still does not fit is walked with frame pointers (counted). Used by one thread (the
// tracer's control loop); only the compiles run on others.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attach/bpf_session.h"
#include "common/clock.h"
#include "symbolize/unwind_table.h"

namespace gpuscope::record {

class UnwindTables {
 public:
  // cache_dir: compiled tables kept between runs (symbolize::load_unwind_table); empty: none.
  // wake: called from a worker thread when a compiled table is ready for update_wanted.
  UnwindTables(attach::BpfSession& bpf, std::string cache_dir, std::function<void()> wake = {});
  ~UnwindTables();  // cancels the compiles under way
  UnwindTables(const UnwindTables&) = delete;
  UnwindTables& operator=(const UnwindTables&) = delete;

  // Reads the process's executable mappings, starts compiling the tables it needs at once and
  // gives the BPF side its mapping table (files not compiled yet marked pending). Never waits
  // for a compile. False if the process is gone.
  bool update(pid_t pid);
  // Lets go of a process (exited): its files' tables may be evicted from now on.
  void forget(pid_t pid);
  // The frames of a stack that came as a copy (any thread): the files they are in get their
  // tables at the next update_wanted, as if walks had asked for them.
  void note_frames(pid_t pid, const std::vector<uint64_t>& ips);
  // Puts compiled tables in place, starts the compiles walks asked for, and reads again the
  // mappings of processes the BPF side asked about (no table yet, or code outside their
  // mappings), at most once a second each. Called at every turn of the control loop.
  void update_wanted();
  // Updates the process again at an update_wanted a poll or more later: it was just stopped at a
  // library's load and will map more (the C library after the CUDA runtime, when the program
  // links both).
  void update_soon(pid_t pid) { soon_.try_emplace(pid, monotonic_ns()); }

  // At the end of a recording: the compiles under way are cancelled (their processes have
  // exited or are no longer watched), those done are put in place, for stats().
  void settle();

  struct Stats {
    size_t files = 0;              // tables in the array
    uint64_t rows_used = 0, rows_capacity = 0;  // row slots (8 bytes), index included
    uint64_t compile_ns = 0;       // worker time spent compiling or reading back, in all
    uint64_t files_compiled = 0;   // tables made (compiled or read back)
    uint64_t files_from_cache = 0;  // of those, read back from the cache
    uint64_t files_at_sight = 0;   // of those, started when their process was seen
    uint64_t files_on_demand = 0;  // ... started because a walk needed them
    uint64_t files_never_needed = 0;  // files mapped, never needed by a walk (no table made)
    uint64_t demand_wait_max_ns = 0;  // a walk's request to its table in place, at most
    uint64_t files_without_room = 0;  // walked with frame pointers: the array was full
    uint64_t files_failed = 0;     // unreadable, or no frame information
    uint64_t evicted = 0;
    uint64_t updates = 0;          // a process's mappings read (at its start, a new library, a walk in none)
    uint64_t update_ns = 0;        // ... and the time that took, in all (some of it while the process was stopped)
    size_t processes = 0;
  };
  Stats stats() const;

 private:
  using FileKey = std::tuple<uint64_t, uint64_t, int64_t>;  // st_dev, st_ino, mtime (ns)
  enum class State : uint8_t {
    Lazy,       // mapped, not needed yet: walks that need it ask (pending in the BPF side)
    Probing,    // on a worker, read back if the cache has it, else Lazy again (pending too)
    Compiling,  // on a worker (pending too)
    Loaded,     // in the array
    None,       // no table: no frame information, unreadable, or no room (frame pointers)
  };
  struct File {
    std::string path;  // as a process mapped it, for messages
    State state = State::Lazy;
    bool on_demand = false;
    uint64_t requested_ns = 0;  // when a walk asked for it
    uint64_t base = 0;
    std::vector<symbolize::UnwindTable::Segment> segments;
    uint32_t off = 0, len = 0;  // rows in the array
    uint32_t slots = 0;         // what the table holds of the array: rows, then their index
    uint32_t index_len = 0, index_shift = 0;
    int refs = 0;
    uint64_t last_used = 0;
  };
  struct Mapped {
    uint64_t start, end, offset;
    FileKey key;
  };
  struct Process {
    std::vector<Mapped> maps;  // sorted by start
    uint64_t updated_ns = 0;
    uint64_t wanted_ns = 0;  // last updated because the BPF side asked
    std::vector<gs_unwind_mapping> sent;  // what the BPF side holds
  };
  struct Job {
    FileKey key;
    int fd;  // the file, held open so that it can be read after its process has gone
    bool cached_only;  // only read back from the cache
  };
  struct Done {
    FileKey key;
    symbolize::CachedTable table;
    bool ok;
    uint64_t ns;
    int fd = -1;  // a cached_only job's file, not in the cache: still open
  };

  // Starts compiling the file a process maps at `start` (its map_files entry), or with
  // cached_only reading its table back from the cache if it is there.
  void start_compile(pid_t pid, const Mapped& m, File& f, bool cached_only = false);
  void queue(const FileKey& key, int fd, bool cached_only);
  void worker();
  // A compiled table into the array (or no table), and every process that maps it told.
  void install(Done& d);
  // The process's mapping table for the BPF side, from its mappings and their files' states;
  // sent when it changed.
  void publish(pid_t pid, Process& p);
  bool allocate(uint32_t n, uint32_t& off);
  void release(uint32_t off, uint32_t n);
  bool evict_one();
  void serve_file_requests();
  void serve_noted_frames();
  // The file a process's mapping at `start` (or holding `ip`) holds: compiled now if no walk
  // needed it before.
  void demand(pid_t pid, Process& p, const Mapped& m, uint64_t now);
  void stop_workers();

  attach::BpfSession& bpf_;
  std::string cache_dir_;
  std::function<void()> wake_;
  std::map<pid_t, uint64_t> soon_;  // update_soon's processes, and when they were named
  std::map<FileKey, File> files_;
  std::map<pid_t, Process> procs_;
  std::map<uint32_t, uint32_t> free_;  // free row ranges: offset -> length
  uint32_t top_ = 0;                   // rows below it have been handed out at some point
  uint64_t clock_ = 0;
  uint32_t generation_ = 0;  // gs_unwind_proc::gen: one counter for all, so that no two entries share one
  Stats stats_;

  // Shared with the workers.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<Done> done_;
  std::vector<std::pair<pid_t, uint64_t>> frames_;  // note_frames', bounded
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

}  // namespace gpuscope::record
