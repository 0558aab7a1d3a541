// An ordered set of block keys with O(1) move-to-front, erase and membership: the list type
// the LRU and ARC policies are built from. Not thread-safe.
#ifndef KVOFFLOAD_SRC_KEY_LIST_H_
#define KVOFFLOAD_SRC_KEY_LIST_H_

#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvoffload/block_key.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {

// Front = most recent, back = least recent.
class KeyList {
 public:
  size_t size() const { return order_.size(); }
  bool empty() const { return order_.empty(); }

  void PushFront(const BlockKey& key) {
    order_.push_front(key);
    index_[key] = order_.begin();
  }
  // True when the key was present.
  bool Erase(const BlockKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    order_.erase(it->second);
    index_.erase(it);
    return true;
  }
  void MoveToFront(const BlockKey& key) {
    auto it = index_.find(key);
    order_.splice(order_.begin(), order_, it->second);
  }
  // Removes and returns the least recent key for which is_pinned is false.
  std::optional<BlockKey> PopLeastRecent(const EvictionPolicy::IsPinned& is_pinned) {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (is_pinned && is_pinned(*it)) continue;
      BlockKey key = *it;
      Erase(key);
      return key;
    }
    return std::nullopt;
  }
  // Drops the least recent key (ghost lists: nothing is pinned there).
  void DropLeastRecent() {
    if (!order_.empty()) Erase(order_.back());
  }
  // Least recent first.
  void AppendLeastRecentFirst(std::vector<BlockKey>& out) const {
    out.insert(out.end(), order_.rbegin(), order_.rend());
  }

 private:
  std::list<BlockKey> order_;
  std::unordered_map<BlockKey, std::list<BlockKey>::iterator, BlockKeyHash> index_;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_KEY_LIST_H_
