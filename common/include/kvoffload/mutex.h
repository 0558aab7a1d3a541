// Mutex, MutexLock and CondVar with Clang thread-safety annotations (-Wthread-safety checks
// GUARDED_BY / REQUIRES under clang; the macros are empty elsewhere), after leveldb's port.
// std::mutex itself carries no annotations, so the analysis needs these thin wrappers.
#ifndef KVOFFLOAD_MUTEX_H_
#define KVOFFLOAD_MUTEX_H_

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define KVO_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVO_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) KVO_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY KVO_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) KVO_THREAD_ANNOTATION(guarded_by(x))
#define REQUIRES(...) KVO_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) KVO_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KVO_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) KVO_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) KVO_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS KVO_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace kvoffload {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds the mutex for a scope; Unlock/Lock let a scope drop it around slow work.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable bound to one Mutex. Callers loop on their predicate around Wait().
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  // REQUIRES: the bound mutex is held; it is released while waiting and held again on return.
  // (Not annotated: the analysis cannot tell that cv_.mu_ is the caller's mu_.)
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  void SignalAll() { cv_.notify_all(); }
  void Signal() { cv_.notify_one(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_MUTEX_H_
