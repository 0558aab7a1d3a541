// LRU: evict the block used least recently.
#include <string>

#include "key_list.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void OnInsert(const BlockKey& key) override { list_.PushFront(key); }
  void OnAccess(const BlockKey& key) override { list_.MoveToFront(key); }
  void OnRemove(const BlockKey& key) override { list_.Erase(key); }
  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    return list_.PopLeastRecent(is_pinned);
  }
  size_t resident() const override { return list_.size(); }
  std::vector<BlockKey> EvictionOrder() const override {
    std::vector<BlockKey> out;
    list_.AppendLeastRecentFirst(out);
    return out;
  }
  std::string DebugString() const override { return "lru n=" + std::to_string(list_.size()); }

 private:
  KeyList list_;
};

std::unique_ptr<EvictionPolicy> NewLru(size_t /*capacity_blocks*/) {
  return std::make_unique<LruPolicy>();
}

[[maybe_unused]] const bool kRegistered = RegisterEvictionPolicy("lru", &NewLru);

}  // namespace
}  // namespace kvoffload
