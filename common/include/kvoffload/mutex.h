// Mutex, MutexLock and CondVar with Clang thread-safety annotations (-Wthread-safety checks
// GUARDED_BY / REQUIRES under clang; the macros are empty elsewhere), after leveldb's port.
// std::mutex itself carries no annotations, so the analysis needs these thin wrappers.
#ifndef KVOFFLOAD_MUTEX_H_
#define KVOFFLOAD_MUTEX_H_

#include <pthread.h>

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
// On pthread_cond_t rather than std::condition_variable: libkvoffload is loaded into vLLM images
// we do not build, and GCC 12's std::condition_variable::wait needs GLIBCXX_3.4.30, which the
// libstdc++ of GCC 11 (Red Hat's UBI 9, the base of vLLM's Dockerfile.ubi images) lacks;
// glibc's is the same primitive and every image has it.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  ~CondVar() { pthread_cond_destroy(&cv_); }
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;
  // REQUIRES: the bound mutex is held; it is released while waiting and held again on return.
  // (Not annotated: the analysis cannot tell that cv_.mu_ is the caller's mu_.)
  void Wait() { pthread_cond_wait(&cv_, mu_->mu_.native_handle()); }
  void SignalAll() { pthread_cond_broadcast(&cv_); }
  void Signal() { pthread_cond_signal(&cv_); }

 private:
  Mutex* const mu_;
  pthread_cond_t cv_ = PTHREAD_COND_INITIALIZER;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_MUTEX_H_
