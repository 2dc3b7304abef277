// Removing a uprobe link waits for the kernel to know that no probe handler still runs (an SRCU
// or RCU-tasks grace period: 25-75 ms each on the dev VM). The thread that attaches the probes of
// processes held stopped at their CUDA library's load must not wait so: every new process would
// wait with it. Links of processes that exited, or whose probes the budget switched off, are
// closed here instead, on threads of their own. Concurrent waits share grace periods: under
// churn, more threads close more links a second (dev VM, short CUDA programs under the agent:
// 92 a second with 16 threads, 312 with 64), and links waiting to close cost the kernel on
// every uprobe operation on their file (it walks each probe's consumers), so the pool grows
// while jobs wait, up to max_threads.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace gpuscope::attach {

class LinkCloser {
 public:
  // Past `max_pending` jobs waiting, close() runs the job on the caller's thread: the links'
  // file descriptors stay bounded however fast processes come and go.
  explicit LinkCloser(int max_threads = 64, size_t max_pending = 256);
  // Runs every job still waiting, then joins.
  ~LinkCloser();
  LinkCloser(const LinkCloser&) = delete;
  LinkCloser& operator=(const LinkCloser&) = delete;

  // Runs `job` (which closes links) soon, on a closer thread. `pid`: the process whose links
  // they are (0: none in particular), for wait_for.
  void close(pid_t pid, std::function<void()> job);
  // Returns once every job given for `pid` so far has run: its old probes are gone before new
  // ones are attached, so that no call is seen twice.
  void wait_for(pid_t pid);
  // Returns once every job given so far has run.
  void drain();
  size_t pending() const;

 private:
  void work();
  mutable std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<std::pair<pid_t, std::function<void()>>> jobs_;
  std::map<pid_t, int> unfinished_;  // jobs given and not yet run, by process
  int running_ = 0;
  int idle_ = 0;  // threads waiting for a job
  int max_threads_;
  size_t max_pending_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace gpuscope::attach
