// chain-lru: LRU over requests rather than blocks, and within a request deepest block first.
//
// A request reads its prefix chain head first, so under plain LRU the head of every chain is
// the least recent of its blocks and goes first. Once the head is gone the rest of the chain
// is unusable (prefix caching needs every block before it), and re-storing the head evicts the
// next block of the same chain: LRU eats a chain from the front. This policy places each
// block of a chain (OnInsertAt / OnAccessAt, see eviction_policy.h) just behind the block
// before it, so a request's blocks sit together in the recency list with the head most recent
// and the victim is the deepest block of the least recent request: caches that cannot hold a
// whole chain keep its usable front. Calls without a position (OnInsert / OnAccess) are plain
// LRU, so the policy is never worse informed than lru. A block joins the latest call's block
// only when its position is past that block's (a store skips the blocks its request has
// stored already): jobs interleave their calls, so "the latest chain" may be another
// request's, and a chain that starts anew, at a position no further than the latest, starts
// at the front (placed behind another's deepest block, a chain just read was the next victim).
//
// Cost: one index probe per call, as lru; placing behind the previous block instead of at the
// front is the same relinking.
#include <span>
#include <string>

#include "eviction_policies.h"
#include "key_list.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

class ChainLruPolicy final : public EvictionPolicy {
 public:
  // The tier inserts before it evicts, so it holds one block over capacity for a moment.
  explicit ChainLruPolicy(size_t capacity) : list_(capacity + 1) {}

  std::string_view name() const override { return "chain-lru"; }
  void OnInsert(const BlockKey& key) override { OnInsertAt(key, kUnknownPosition); }
  void OnAccess(const BlockKey& key) override { OnAccessAt(key, kUnknownPosition); }
  void OnInsertAt(const BlockKey& key, uint32_t position) override {
    const Keys::Node anchor = Anchor(position);
    SetLast(anchor != Keys::kNone ? list_.PushAfter(anchor, key) : list_.PushFront(kList, key),
            position);
  }
  void OnAccessAt(const BlockKey& key, uint32_t position) override {
    Access(list_.Find(key), position);
  }
  void OnAccessBatch(std::span<const BlockKey> keys,
                     std::span<const uint32_t> positions) override {
    list_.ForEachFound(keys,
                       [&](size_t i, Keys::Node n, uint64_t) { Access(n, positions[i]); });
  }
  void OnRemove(const BlockKey& key) override {
    if (Keys::Node n = list_.Find(key); n != Keys::kNone) Erase(n);
  }
  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    Keys::Node n = list_.LeastRecentUnpinned(kList, is_pinned);
    if (n == Keys::kNone) return std::nullopt;
    BlockKey victim = list_.key(n);
    Erase(n);
    return victim;
  }
  size_t resident() const override { return list_.size(kList); }
  std::vector<BlockKey> EvictionOrder() const override { return list_.LeastRecentFirst(kList); }
  std::string DebugString() const override {
    return "chain-lru n=" + std::to_string(list_.size(kList));
  }

 private:
  using Keys = KeyLists<1>;
  static constexpr Keys::ListId kList = 0;

  // The block to place a chain's next block behind: the latest call's block when this call's
  // position is past it (and that block is still here); otherwise this call starts a chain.
  // A call without a position ends the chain.
  Keys::Node Anchor(uint32_t position) const {
    if (position == 0 || position == kUnknownPosition) return Keys::kNone;
    return position > chain_last_position_ ? chain_last_ : Keys::kNone;
  }
  void SetLast(Keys::Node n, uint32_t position) {
    chain_last_ = position == kUnknownPosition ? Keys::kNone : n;
    chain_last_position_ = position;
  }
  // A use of node n (kNone: not resident, ignored) at `position` of the chain being loaded.
  void Access(Keys::Node n, uint32_t position) {
    if (n == Keys::kNone) return;
    const Keys::Node anchor = Anchor(position);
    if (anchor == Keys::kNone) {
      list_.MoveToFront(kList, n);
    } else if (anchor != n) {  // the same block read twice in a row stays where it is
      list_.MoveAfter(anchor, n);
    }
    SetLast(n, position);
  }
  void Erase(Keys::Node n) {
    if (n == chain_last_) chain_last_ = Keys::kNone;  // its slab node may be reused
    list_.Erase(n);
  }

  Keys list_;
  Keys::Node chain_last_ = Keys::kNone;
  uint32_t chain_last_position_ = kUnknownPosition;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewChainLruPolicy(size_t capacity_blocks) {
  return std::make_unique<ChainLruPolicy>(capacity_blocks);
}
}  // namespace kvoffload
