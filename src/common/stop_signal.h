// A sampler thread's sleep that stop() ends at once: the thread wakes only when its next sample
// is due, not every few milliseconds to look at a flag (each wake-up costs a context switch).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace gpuscope {

class StopSignal {
 public:
  // Sleeps until `t` or stop(); false once stopped.
  bool sleep_until(std::chrono::steady_clock::time_point t) {
    std::unique_lock lock(mu_);
    return !cv_.wait_until(lock, t, [this] { return stopped_; });
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }
  void reset() {
    std::lock_guard lock(mu_);
    stopped_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
};

}  // namespace gpuscope
