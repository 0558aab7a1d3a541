// ARC (Megiddo & Modha, FAST'03): T1 holds blocks seen once recently, T2 blocks seen at least
// twice; ghost lists B1/B2 remember keys evicted from each. A hit in B1 means T1 was too small
// and grows the target p for T1; a hit in B2 shrinks it. A one-time scan only churns T1, so the
// frequently used blocks in T2 survive it (where LRU would flush them).
//
// Mapping onto the tier protocol: OnInsert is the paper's miss path (cases II-IV) minus the
// REPLACE call, which the tier triggers right after through SelectVictim while it needs room;
// the ghost-list bounds (|T1|+|B1| <= c, total <= 2c) are restored after every step.
#include <algorithm>
#include <string>

#include "key_list.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

class ArcPolicy final : public EvictionPolicy {
 public:
  explicit ArcPolicy(size_t capacity) : c_(capacity) {}

  std::string_view name() const override { return "arc"; }

  void OnInsert(const BlockKey& key) override {
    last_insert_was_b2_hit_ = false;
    if (b1_.Erase(key)) {
      // Case II: recency was undervalued.
      size_t delta = std::max<size_t>(1, b2_.size() / (b1_.size() + 1));  // |B1| before
      p_ = std::min(c_, p_ + delta);
      t2_.PushFront(key);
    } else if (b2_.Erase(key)) {
      // Case III: frequency was undervalued.
      size_t delta = std::max<size_t>(1, b1_.size() / (b2_.size() + 1));  // |B2| before
      p_ = p_ > delta ? p_ - delta : 0;
      t2_.PushFront(key);
      last_insert_was_b2_hit_ = true;
    } else {
      t1_.PushFront(key);  // Case IV
    }
    TrimGhosts();
  }

  void OnAccess(const BlockKey& key) override {
    // Case I: a second use makes the block frequent.
    if (t1_.Erase(key)) {
      t2_.PushFront(key);
    } else {
      t2_.MoveToFront(key);
    }
  }

  void OnRemove(const BlockKey& key) override {
    if (!t1_.Erase(key)) t2_.Erase(key);
  }

  // REPLACE(x, p): evict from T1 when it exceeds its target (or ties it on a B2 hit), else T2;
  // falls back to the other list when every candidate of the preferred one is pinned.
  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    bool from_t1 =
        !t1_.empty() && (t1_.size() > p_ || (last_insert_was_b2_hit_ && t1_.size() == p_));
    if (t2_.empty()) from_t1 = true;
    std::optional<BlockKey> victim = (from_t1 ? t1_ : t2_).PopLeastRecent(is_pinned);
    bool victim_from_t1 = from_t1;
    if (!victim) {
      victim = (from_t1 ? t2_ : t1_).PopLeastRecent(is_pinned);
      victim_from_t1 = !from_t1;
    }
    if (victim) {
      (victim_from_t1 ? b1_ : b2_).PushFront(*victim);
      TrimGhosts();
    }
    return victim;
  }

  size_t resident() const override { return t1_.size() + t2_.size(); }

  std::vector<BlockKey> EvictionOrder() const override {
    // Approximation for inspection: T1 before T2 when T1 is over its target.
    std::vector<BlockKey> out;
    if (t1_.size() > p_) {
      t1_.AppendLeastRecentFirst(out);
      t2_.AppendLeastRecentFirst(out);
    } else {
      t2_.AppendLeastRecentFirst(out);
      t1_.AppendLeastRecentFirst(out);
    }
    return out;
  }

  std::string DebugString() const override {
    return "arc c=" + std::to_string(c_) + " p=" + std::to_string(p_) +
           " t1=" + std::to_string(t1_.size()) + " t2=" + std::to_string(t2_.size()) +
           " b1=" + std::to_string(b1_.size()) + " b2=" + std::to_string(b2_.size());
  }

 private:
  // Ghosts only record history; they are dropped least recent first to keep the paper's bounds.
  void TrimGhosts() {
    while (!b1_.empty() && t1_.size() + b1_.size() > c_) b1_.DropLeastRecent();
    while (!b2_.empty() && t1_.size() + t2_.size() + b1_.size() + b2_.size() > 2 * c_) {
      b2_.DropLeastRecent();
    }
    while (!b1_.empty() && t1_.size() + t2_.size() + b1_.size() + b2_.size() > 2 * c_) {
      b1_.DropLeastRecent();
    }
  }

  const size_t c_;
  size_t p_ = 0;  // target size of T1
  bool last_insert_was_b2_hit_ = false;
  KeyList t1_, t2_, b1_, b2_;
};

std::unique_ptr<EvictionPolicy> NewArc(size_t capacity_blocks) {
  return std::make_unique<ArcPolicy>(capacity_blocks);
}

[[maybe_unused]] const bool kRegistered = RegisterEvictionPolicy("arc", &NewArc);

}  // namespace
}  // namespace kvoffload
