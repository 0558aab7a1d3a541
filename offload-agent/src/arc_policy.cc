// ARC (Megiddo & Modha, FAST'03): T1 holds blocks seen once recently, T2 blocks seen at least
// twice; ghost lists B1/B2 remember keys evicted from each. A hit in B1 means T1 was too small
// and grows the target p for T1; a hit in B2 shrinks it. A one-time scan only churns T1, so the
// frequently used blocks in T2 survive it (where LRU would flush them).
//
// Mapping onto the tier protocol: OnInsert is the paper's miss path (cases II-IV) minus the
// REPLACE call, which the tier triggers right after through SelectVictim while it needs room;
// the ghost-list bounds (|T1|+|B1| <= c, total <= 2c) are restored after every step.
#include <algorithm>
#include <span>
#include <string>

#include "eviction_policies.h"
#include "key_list.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

class ArcPolicy final : public EvictionPolicy {
 public:
  // Up to 2c keys with the ghosts, one more while an insert waits for its eviction.
  explicit ArcPolicy(size_t capacity) : c_(capacity), keys_(2 * capacity + 1) {}

  std::string_view name() const override { return "arc"; }

  void OnInsert(const BlockKey& key) override {
    last_insert_was_b2_hit_ = false;
    const Keys::Node n = keys_.Find(key);
    const bool in_b1 = n != Keys::kNone && keys_.list(n) == kB1;
    const bool in_b2 = n != Keys::kNone && keys_.list(n) == kB2;
    if (in_b1) {
      // Case II: recency was undervalued.
      keys_.MoveToFront(kT2, n);
      size_t delta = std::max<size_t>(1, size(kB2) / (size(kB1) + 1));  // |B1| before
      p_ = std::min(c_, p_ + delta);
    } else if (in_b2) {
      // Case III: frequency was undervalued.
      keys_.MoveToFront(kT2, n);
      size_t delta = std::max<size_t>(1, size(kB1) / (size(kB2) + 1));  // |B2| before
      p_ = p_ > delta ? p_ - delta : 0;
      last_insert_was_b2_hit_ = true;
    } else {
      keys_.PushFront(kT1, key);  // Case IV
    }
    TrimGhosts();
  }

  void OnAccess(const BlockKey& key) override { Access(keys_.Find(key)); }
  void OnAccessBatch(std::span<const BlockKey> keys, std::span<const uint32_t>) override {
    keys_.ForEachFound(keys, [this](size_t, Keys::Node n, uint64_t) { Access(n); });
  }

  void OnRemove(const BlockKey& key) override {
    const Keys::Node n = keys_.Find(key);
    if (n != Keys::kNone && IsResident(keys_.list(n))) keys_.Erase(n);
  }

  // REPLACE(x, p): evict from T1 when it exceeds its target (or ties it on a B2 hit), else T2;
  // falls back to the other list when every candidate of the preferred one is pinned.
  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    bool from_t1 =
        !empty(kT1) && (size(kT1) > p_ || (last_insert_was_b2_hit_ && size(kT1) == p_));
    if (empty(kT2)) from_t1 = true;
    Keys::Node victim = keys_.LeastRecentUnpinned(from_t1 ? kT1 : kT2, is_pinned);
    bool victim_from_t1 = from_t1;
    if (victim == Keys::kNone) {
      victim = keys_.LeastRecentUnpinned(from_t1 ? kT2 : kT1, is_pinned);
      victim_from_t1 = !from_t1;
    }
    if (victim == Keys::kNone) return std::nullopt;
    const BlockKey key = keys_.key(victim);  // before TrimGhosts, which may drop it again
    keys_.MoveToFront(victim_from_t1 ? kB1 : kB2, victim);
    TrimGhosts();
    return key;
  }

  size_t resident() const override { return size(kT1) + size(kT2); }

  std::vector<BlockKey> EvictionOrder() const override {
    // Approximation for inspection: T1 before T2 when T1 is over its target.
    std::vector<BlockKey> out;
    const bool t1_first = size(kT1) > p_;
    keys_.AppendLeastRecentFirst(t1_first ? kT1 : kT2, out);
    keys_.AppendLeastRecentFirst(t1_first ? kT2 : kT1, out);
    return out;
  }

  std::string DebugString() const override {
    return "arc c=" + std::to_string(c_) + " p=" + std::to_string(p_) +
           " t1=" + std::to_string(size(kT1)) + " t2=" + std::to_string(size(kT2)) +
           " b1=" + std::to_string(size(kB1)) + " b2=" + std::to_string(size(kB2));
  }

 private:
  // The four lists share one key index: a key is in at most one of them, so every operation
  // finds it with one probe, and a key changing lists (T1 -> T2, T -> B, B -> T2) keeps its
  // node and index slot.
  using Keys = KeyLists<4>;
  enum : Keys::ListId { kT1, kT2, kB1, kB2 };
  static bool IsResident(Keys::ListId l) { return l == kT1 || l == kT2; }
  // Case I: a second use makes the block frequent (and a later one keeps it most recent).
  // n: the key's node, kNone when unknown.
  void Access(Keys::Node n) {
    if (n != Keys::kNone && IsResident(keys_.list(n))) keys_.MoveToFront(kT2, n);
  }

  size_t size(Keys::ListId l) const { return keys_.size(l); }
  bool empty(Keys::ListId l) const { return keys_.empty(l); }
  size_t total() const { return size(kT1) + size(kT2) + size(kB1) + size(kB2); }

  // Ghosts only record history; they are dropped least recent first to keep the paper's bounds.
  void TrimGhosts() {
    while (!empty(kB1) && size(kT1) + size(kB1) > c_) keys_.Erase(keys_.back(kB1));
    while (!empty(kB2) && total() > 2 * c_) keys_.Erase(keys_.back(kB2));
    while (!empty(kB1) && total() > 2 * c_) keys_.Erase(keys_.back(kB1));
  }

  const size_t c_;
  size_t p_ = 0;  // target size of T1
  bool last_insert_was_b2_hit_ = false;
  Keys keys_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewArcPolicy(size_t capacity_blocks) {
  return std::make_unique<ArcPolicy>(capacity_blocks);
}
}  // namespace kvoffload
