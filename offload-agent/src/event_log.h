// The residency feed (Engine::TakeEvents): which block entered or left which tier, in order, for
// vLLM's KV cache events (BlockStored / BlockRemoved per medium). Bounded: a caller that stops
// taking events costs at most `capacity` entries; later events are counted as dropped.
// Thread-safe. Its mutex is a leaf: tiers record under their own lock.
#ifndef KVOFFLOAD_SRC_EVENT_LOG_H_
#define KVOFFLOAD_SRC_EVENT_LOG_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>

#include "kvoffload/engine.h"
#include "kvoffload/mutex.h"

namespace kvoffload {

class EventLog {
 public:
  explicit EventLog(size_t capacity) : capacity_(capacity) {}

  void Record(const BlockKey& key, int tier, bool removed) {
    MutexLock lock(&mu_);
    if (events_.size() >= capacity_) {
      ++dropped_;
      return;
    }
    events_.push_back(TierEvent{key, tier, removed});
  }

  // Moves the oldest events into out; returns how many.
  size_t Take(std::span<TierEvent> out) {
    MutexLock lock(&mu_);
    const size_t n = std::min(out.size(), events_.size());
    std::copy_n(events_.begin(), n, out.begin());
    events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(n));
    return n;
  }

  uint64_t dropped() const {
    MutexLock lock(&mu_);
    return dropped_;
  }

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::deque<TierEvent> events_ GUARDED_BY(mu_);
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_EVENT_LOG_H_
