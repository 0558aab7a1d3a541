// The worker pool under the engine, the host device, the psync backend and the webhook: every
// job runs once, oldest first; the worker idle last takes the next job; the workers run at the
// same time; Stop runs or drops the queued jobs as asked, always lets a started job finish, and
// refuses jobs pushed after it began.
#include "kvoffload/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace kvoffload {
namespace {

using std::chrono::seconds;

// A gate that jobs wait at until the test opens it; Wait gives up (false) after a bound, so a
// broken queue fails the test instead of hanging it.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, seconds(20), [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Counts up to a number, and lets a thread wait for it (bounded like Gate).
class Counter {
 public:
  void Add() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++n_;
    }
    cv_.notify_all();
  }
  bool WaitFor(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, seconds(20), [&] { return n_ >= n; });
  }
  int value() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

TEST(WorkQueueTest, RunsEveryJobExactlyOnce) {
  constexpr size_t kJobs = 1000;
  std::vector<std::atomic<int>> runs(kJobs);
  {
    WorkQueue q(4, WorkQueue::OnStop::kRunQueued);
    EXPECT_EQ(q.threads(), 4u);
    for (size_t i = 0; i < kJobs; ++i) ASSERT_TRUE(q.Push([&runs, i] { ++runs[i]; }));
  }  // the destructor stops the queue and runs what is still queued
  for (size_t i = 0; i < kJobs; ++i) EXPECT_EQ(runs[i].load(), 1) << "job " << i;
}

TEST(WorkQueueTest, OneWorkerRunsJobsInTheOrderTheyWerePushed) {
  std::vector<int> order;  // only the one worker touches it until Stop returns
  WorkQueue q(1, WorkQueue::OnStop::kRunQueued);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(q.Push([&order, i] { order.push_back(i); }));
  q.Stop();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

// Jobs pushed one at a time all go to the worker that went idle last, so a large pool under
// light load keeps one thread (and its caches) busy rather than rotating through all of them.
TEST(WorkQueueTest, TheWorkerIdleLastTakesTheNextJob) {
  constexpr size_t kThreads = 4;
  // Before the queue, so that its workers are gone before what their jobs touch.
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  Counter done;
  WorkQueue q(kThreads, WorkQueue::OnStop::kRunQueued);
  auto all_idle = [&q] {
    const auto deadline = std::chrono::steady_clock::now() + seconds(20);
    while (q.idle_threads() < kThreads) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  };
  ASSERT_TRUE(all_idle());
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(q.Push([&] {
      {
        std::lock_guard<std::mutex> lock(mu);
        ran_on.insert(std::this_thread::get_id());
      }
      done.Add();
    }));
    ASSERT_TRUE(done.WaitFor(i + 1));
    ASSERT_TRUE(all_idle());
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(ran_on.size(), 1u);
}

// A queue capped at one running job runs its jobs one after another however many workers it
// has: each job checks that no other is running while it works.
TEST(WorkQueueTest, AtMostMaxRunningJobsRunAtOnce) {
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  {
    WorkQueue q(4, WorkQueue::OnStop::kRunQueued, /*max_running=*/1);
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(q.Push([&] {
        if (running.fetch_add(1) != 0) ++overlaps;
        for (int spin = 0; spin < 100; ++spin) std::this_thread::yield();
        running.fetch_sub(1);
      }));
    }
  }
  EXPECT_EQ(overlaps.load(), 0);
}

// A job waiting inside a Blocking scope gives up its place: with one running job allowed, the
// next job runs while the first waits for it (without the scope the first would wait in vain).
TEST(WorkQueueTest, AJobInABlockingScopeLetsAnotherRun) {
  Gate second_ran;
  std::atomic<bool> first_saw_it{false};
  Counter done;
  WorkQueue q(2, WorkQueue::OnStop::kRunQueued, /*max_running=*/1);
  ASSERT_TRUE(q.Push([&] {
    const WorkQueue::Blocking waiting;
    first_saw_it = second_ran.Wait();
    done.Add();
  }));
  ASSERT_TRUE(q.Push([&] {
    second_ran.Open();
    done.Add();
  }));
  ASSERT_TRUE(done.WaitFor(2));
  EXPECT_TRUE(first_saw_it.load());
}

// Outside a queue's worker a Blocking scope does nothing (the webhook's lookups also run on
// test threads and in `inject`).
TEST(WorkQueueTest, BlockingOutsideAWorkerIsANoOp) {
  Counter done;
  WorkQueue q(1, WorkQueue::OnStop::kRunQueued, /*max_running=*/1);
  { const WorkQueue::Blocking waiting; }
  ASSERT_TRUE(q.Push([&done] { done.Add(); }));
  EXPECT_TRUE(done.WaitFor(1));
}

TEST(WorkQueueTest, WorkersRunJobsAtTheSameTime) {
  constexpr int kThreads = 3;
  Counter started;
  Gate all_started;
  std::atomic<int> saw_all{0};
  WorkQueue q(kThreads, WorkQueue::OnStop::kRunQueued);
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(q.Push([&] {
      started.Add();
      // Only true if every job is running at once: each waits for the others to start.
      if (started.WaitFor(kThreads)) ++saw_all;
    }));
  }
  q.Stop();
  EXPECT_EQ(saw_all.load(), kThreads) << "the jobs did not all run at the same time";
}

// The owner's shutdown on another thread while the one worker is busy and jobs are queued:
// returns the number of pushes accepted before Push refused.
struct StopScenario {
  Gate release;     // lets the running job finish
  Counter running;  // the running job has started
  std::atomic<bool> first_finished{false};
  std::atomic<int> queued_runs{0};
  std::shared_ptr<int> token = std::make_shared<int>(0);  // queued jobs hold a copy
  int accepted_late = 0;

  void Run(WorkQueue::OnStop on_stop) {
    WorkQueue q(1, on_stop);
    ASSERT_TRUE(q.Push([this] {
      running.Add();
      ASSERT_TRUE(release.Wait());
      first_finished = true;
    }));
    ASSERT_TRUE(running.WaitFor(1));
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(q.Push([this, t = token] {
        static_cast<void>(t);  // held only to count the live jobs
        ++queued_runs;
      }));
    }
    std::thread stopper([&q] { q.Stop(); });
    // Stop begins while the first job still runs: Push is refused from then on.
    while (q.Push([this, t = token] {
      static_cast<void>(t);
      ++queued_runs;
    })) {
      ++accepted_late;
    }
    release.Open();
    stopper.join();
  }
};

TEST(WorkQueueTest, StopRunsQueuedJobsWhenAskedTo) {
  StopScenario s;
  s.Run(WorkQueue::OnStop::kRunQueued);
  EXPECT_TRUE(s.first_finished);
  EXPECT_EQ(s.queued_runs.load(), 10 + s.accepted_late);
  EXPECT_EQ(s.token.use_count(), 1) << "every job was destroyed once it ran";
}

TEST(WorkQueueTest, StopDropsQueuedJobsButFinishesTheRunningOne) {
  StopScenario s;
  s.Run(WorkQueue::OnStop::kDropQueued);
  EXPECT_TRUE(s.first_finished) << "the job that had started ran to its end";
  EXPECT_EQ(s.queued_runs.load(), 0) << "queued jobs were dropped unrun";
  EXPECT_EQ(s.token.use_count(), 1) << "the dropped jobs were destroyed";
}

TEST(WorkQueueTest, StopTwiceAndPushAfterStop) {
  std::atomic<int> runs{0};
  WorkQueue q(2, WorkQueue::OnStop::kRunQueued);
  ASSERT_TRUE(q.Push([&] { ++runs; }));
  q.Stop();
  q.Stop();
  EXPECT_FALSE(q.Push([&] { ++runs; }));
  EXPECT_EQ(runs.load(), 1);
}

}  // namespace
}  // namespace kvoffload
