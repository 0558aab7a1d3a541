// WorkQueue: a fixed pool of threads that run queued jobs, oldest first. The engine runs its
// store and load jobs on one, the host device its copies, the psync disk backend its reads and
// writes. Thread-safe: any thread may Push; Stop (and the destructor) belong to the owner.
#ifndef KVOFFLOAD_SRC_WORK_QUEUE_H_
#define KVOFFLOAD_SRC_WORK_QUEUE_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "mutex.h"

namespace kvoffload {

class WorkQueue {
 public:
  using Job = std::function<void()>;

  // What Stop does with the jobs that no worker has started yet. A job that has started
  // always runs to its end: a copy or a read cut short would leave memory half written.
  enum class OnStop {
    kRunQueued,   // the workers run them all before they exit
    kDropQueued,  // they are destroyed unrun (their owner tells whoever waits on them)
  };

  // Starts `threads` workers. REQUIRES: threads > 0.
  WorkQueue(size_t threads, OnStop on_stop) : on_stop_(on_stop) {
    workers_.reserve(threads);
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Loop(); });
  }
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `job` behind the others; a worker runs it once those have started. False, with
  // the job destroyed unrun, once Stop has begun.
  [[nodiscard]] bool Push(Job job) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return false;
      queue_.push_back(std::move(job));
    }
    queued_.Signal();
    return true;
  }

  // Refuses new jobs, deals with the queued ones as OnStop says, and returns once every
  // worker has finished its job and exited. Later calls return at once.
  // REQUIRES: not called from a job of this queue (it would wait for itself), nor from two
  // threads at once.
  void Stop() EXCLUDES(mu_) {
    std::deque<Job> dropped;
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      if (on_stop_ == OnStop::kDropQueued) dropped.swap(queue_);
    }
    queued_.SignalAll();
    dropped.clear();  // outside the lock: destroying a job's captures runs its owner's code
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

  size_t threads() const { return workers_.size(); }

 private:
  void Loop() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    for (;;) {
      while (!stopping_ && queue_.empty()) queued_.Wait();
      if (queue_.empty()) return;  // stopping, and nothing left that must run
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.Unlock();
      job();
      // Released before the lock is taken again: the last reference to what the job captured
      // may free it, which needs no lock of ours.
      job = nullptr;
      lock.Lock();
    }
  }

  const OnStop on_stop_;
  Mutex mu_;
  CondVar queued_{&mu_};  // a job was queued, or the queue is stopping
  std::deque<Job> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // last: the workers start once the rest is built
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_WORK_QUEUE_H_
