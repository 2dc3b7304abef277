#include "attach/link_closer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

using gpuscope::attach::LinkCloser;

namespace {

// A job that blocks until released: stands for a link whose removal waits a grace period.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  std::promise<void> began;
  std::function<void()> job(std::atomic<int>& ran) {
    return [this, f = opened, &ran] {
      began.set_value();
      f.wait();
      ++ran;
    };
  }
};

TEST(LinkCloser, ReturnsBeforeTheJobRuns) {
  LinkCloser closer(2);
  Gate gate;
  std::atomic<int> ran{0};
  closer.close(7, gate.job(ran));
  EXPECT_EQ(ran, 0);
  EXPECT_EQ(closer.pending(), 1u);
  gate.open.set_value();
  closer.wait_for(7);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(closer.pending(), 0u);
}

TEST(LinkCloser, WaitForWaitsOnlyForThatProcess) {
  LinkCloser closer(2);
  Gate slow;
  std::atomic<int> ran{0};
  closer.close(1, slow.job(ran));
  closer.close(2, [&] { ++ran; });
  closer.wait_for(2);  // returns while process 1's job is still blocked
  EXPECT_EQ(ran, 1);
  closer.wait_for(3);  // nothing given for it
  auto waiting = std::async(std::launch::async, [&] { closer.wait_for(1); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  slow.open.set_value();
  waiting.get();
  EXPECT_EQ(ran, 2);
}

TEST(LinkCloser, PastItsBoundJobsRunOnTheCaller) {
  LinkCloser closer(1, 2);
  Gate gate;
  std::atomic<int> ran{0};
  closer.close(1, gate.job(ran));  // taken by the one thread
  gate.began.get_future().wait();  // the thread holds it: the queue is empty again
  closer.close(2, [&] { ++ran; });
  closer.close(3, [&] { ++ran; });  // two waiting: the bound
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  closer.close(4, [&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, caller);
  gate.open.set_value();
  closer.drain();
  EXPECT_EQ(ran, 3);
}

TEST(LinkCloser, RunsEveryJobBeforeItGoes) {
  std::atomic<int> ran{0};
  {
    LinkCloser closer(3);
    for (int i = 0; i < 100; ++i)
      closer.close(i % 5, [&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++ran;
      });
  }
  EXPECT_EQ(ran, 100);
}

}  // namespace
