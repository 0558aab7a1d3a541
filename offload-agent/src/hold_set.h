// The blocks the engine's caller holds (Engine::Hold): no tier evicts a held block until it is
// released. vLLM's scheduler looks a block up, then loads it a step later, while the engine's
// store jobs keep evicting on their own threads; a hold closes that window. Holds count, since
// two requests may hold one block.
// Thread-safe. Its mutex is a leaf: tiers consult it under their own lock, it calls nothing.
#ifndef KVOFFLOAD_SRC_HOLD_SET_H_
#define KVOFFLOAD_SRC_HOLD_SET_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "kvoffload/block_key.h"
#include "kvoffload/mutex.h"

namespace kvoffload {

class HoldSet {
 public:
  void Add(const BlockKey& key) {
    MutexLock lock(&mu_);
    ++counts_[key];
  }

  // Drops one hold; false when the key was not held.
  bool Remove(const BlockKey& key) {
    MutexLock lock(&mu_);
    auto it = counts_.find(key);
    if (it == counts_.end()) return false;
    if (--it->second == 0) counts_.erase(it);
    return true;
  }

  bool Contains(const BlockKey& key) const {
    MutexLock lock(&mu_);
    return counts_.contains(key);
  }

  // Distinct held keys.
  size_t size() const {
    MutexLock lock(&mu_);
    return counts_.size();
  }

 private:
  mutable Mutex mu_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> counts_ GUARDED_BY(mu_);
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_HOLD_SET_H_
