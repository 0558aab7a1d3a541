// LRU: evict the block used least recently.
#include <span>
#include <string>

#include "eviction_policies.h"
#include "key_list.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  // The tier inserts before it evicts, so it holds one block over capacity for a moment.
  explicit LruPolicy(size_t capacity) : list_(capacity + 1) {}

  std::string_view name() const override { return "lru"; }
  void OnInsert(const BlockKey& key) override { list_.PushFront(kList, key); }
  void OnAccess(const BlockKey& key) override { Use(list_.Find(key)); }
  void OnAccessBatch(std::span<const BlockKey> keys, std::span<const uint32_t>) override {
    list_.ForEachFound(keys, [this](size_t, Keys::Node n, uint64_t) { Use(n); });
  }
  void OnRemove(const BlockKey& key) override {
    if (Keys::Node n = list_.Find(key); n != Keys::kNone) list_.Erase(n);
  }
  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    return list_.PopLeastRecentUnpinned(kList, is_pinned);
  }
  size_t resident() const override { return list_.size(kList); }
  std::vector<BlockKey> EvictionOrder() const override { return list_.LeastRecentFirst(kList); }
  std::string DebugString() const override {
    return "lru n=" + std::to_string(list_.size(kList));
  }

 private:
  using Keys = KeyLists<1>;
  static constexpr Keys::ListId kList = 0;
  // A use of the key whose node is n (kNone: not resident, ignored).
  void Use(Keys::Node n) {
    if (n != Keys::kNone) list_.MoveToFront(kList, n);
  }
  Keys list_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLruPolicy(size_t capacity_blocks) {
  return std::make_unique<LruPolicy>(capacity_blocks);
}
}  // namespace kvoffload
