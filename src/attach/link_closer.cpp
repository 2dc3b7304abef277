#include "attach/link_closer.h"

#include "common/thread_name.h"

namespace gpuscope::attach {

LinkCloser::LinkCloser(int max_threads, size_t max_pending) : max_threads_(max_threads), max_pending_(max_pending) {}

LinkCloser::~LinkCloser() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void LinkCloser::close(pid_t pid, std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (jobs_.size() < max_pending_ && max_threads_ > 0) {
      jobs_.emplace_back(pid, std::move(job));
      ++unfinished_[pid];
      if (idle_ < int(jobs_.size()) && int(threads_.size()) < max_threads_) {
        ++idle_;  // until it takes its first job
        threads_.emplace_back([this] {
          name_this_thread("gs-link-closer");
          work();
        });
      }
      wake_.notify_one();
      return;
    }
  }
  job();
}

void LinkCloser::wait_for(pid_t pid) {
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return !unfinished_.contains(pid); });
}

void LinkCloser::drain() {
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return unfinished_.empty(); });
}

size_t LinkCloser::pending() const {
  std::lock_guard lock(mu_);
  return jobs_.size() + size_t(running_);
}

void LinkCloser::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    // Jobs still waiting at the end are run too: each holds links that must close.
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    auto [pid, job] = std::move(jobs_.front());
    jobs_.pop_front();
    --idle_;
    ++running_;
    lock.unlock();
    job();
    job = nullptr;  // what it captured (links) goes before the job counts as done
    lock.lock();
    --running_;
    ++idle_;
    if (auto it = unfinished_.find(pid); it != unfinished_.end() && --it->second == 0) unfinished_.erase(it);
    done_.notify_all();
  }
}

}  // namespace gpuscope::attach
