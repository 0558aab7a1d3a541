// S3-FIFO (Yang et al., SOSP'23): three FIFO queues. New blocks enter a small queue S (a tenth
// of the capacity); a block used while in S moves to the main queue M when it reaches S's end,
// one never used leaves the cache and is remembered in a ghost queue G. A block stored again
// while remembered in G goes straight to M. M is a FIFO with a 2-bit use count per block: at
// M's end a used block goes back to M's front with its count lowered, an unused one leaves.
//
// Why it suits a KV tier: most stored blocks are never loaded again (a request's unique tail,
// the question of a RAG prompt, a one-off long document), and S turns them over after a tenth
// of the cache instead of letting them age through all of it as LRU does; shared prefixes are
// used while in S or come back through G, and then live in M. A use only bumps the count, so a
// lookup relinks nothing.
#include <algorithm>
#include <string>

#include "eviction_policies.h"
#include "key_list.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  // Resident blocks (capacity, one more while an insert waits for its eviction) and the ghosts
  // (as many as M holds). REQUIRES: capacity > 0 (the factory refuses 0), so S's target fits.
  explicit S3FifoPolicy(size_t capacity)
      : small_target_(std::max<size_t>(1, capacity / 10)),
        ghost_limit_(capacity - small_target_ + 1),
        keys_(2 * capacity + 2) {}

  std::string_view name() const override { return "s3fifo"; }

  void OnInsert(const BlockKey& key) override {
    const Keys::Node n = keys_.Find(key);
    if (n != Keys::kNone && keys_.list(n) == kGhost) {
      keys_.MoveToFront(kMain, n);
      keys_.set_mark(n, 0);
    } else if (n == Keys::kNone) {
      keys_.PushFront(kSmall, key);
    }
  }
  void OnAccess(const BlockKey& key) override {
    const Keys::Node n = keys_.Find(key);
    if (n != Keys::kNone && keys_.list(n) != kGhost) {
      keys_.set_mark(n, std::min<uint32_t>(keys_.mark(n) + 1, kMaxUses));
    }
  }
  void OnRemove(const BlockKey& key) override {
    const Keys::Node n = keys_.Find(key);
    if (n != Keys::kNone && keys_.list(n) != kGhost) keys_.Erase(n);
  }

  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    // Pinned blocks go back to their queue's front; a queue whose blocks were all passed over
    // as pinned is not tried again in this call.
    size_t pinned_small = 0;
    size_t pinned_main = 0;
    // Each block of M is passed at most kMaxUses + 1 times before it goes (its count drops on
    // every pass), each block of S once before it moves to M or leaves.
    for (size_t budget = (kMaxUses + 2) * (resident() + 1); budget > 0; --budget) {
      const bool small_usable = !keys_.empty(kSmall) && pinned_small < keys_.size(kSmall);
      const bool main_usable = !keys_.empty(kMain) && pinned_main < keys_.size(kMain);
      if (!small_usable && !main_usable) return std::nullopt;
      if (small_usable && (keys_.size(kSmall) > small_target_ || !main_usable)) {
        const Keys::Node n = keys_.back(kSmall);
        if (Pinned(is_pinned, n)) {
          keys_.MoveToFront(kSmall, n);
          ++pinned_small;
        } else if (keys_.mark(n) > 0) {
          keys_.set_mark(n, 0);
          keys_.MoveToFront(kMain, n);
        } else {
          const BlockKey victim = keys_.key(n);
          keys_.MoveToFront(kGhost, n);
          while (keys_.size(kGhost) > ghost_limit_) keys_.Erase(keys_.back(kGhost));
          return victim;
        }
      } else {
        const Keys::Node n = keys_.back(kMain);
        if (Pinned(is_pinned, n)) {
          keys_.MoveToFront(kMain, n);
          ++pinned_main;
        } else if (keys_.mark(n) > 0) {
          keys_.set_mark(n, keys_.mark(n) - 1);
          keys_.MoveToFront(kMain, n);
        } else {
          const BlockKey victim = keys_.key(n);
          keys_.Erase(n);
          return victim;
        }
      }
    }
    return std::nullopt;
  }

  size_t resident() const override { return keys_.size(kSmall) + keys_.size(kMain); }
  std::vector<BlockKey> EvictionOrder() const override {
    // Approximation for inspection: S then M, oldest first, ignoring the use counts.
    std::vector<BlockKey> out;
    keys_.AppendLeastRecentFirst(kSmall, out);
    keys_.AppendLeastRecentFirst(kMain, out);
    return out;
  }
  std::string DebugString() const override {
    return "s3fifo s=" + std::to_string(keys_.size(kSmall)) +
           " m=" + std::to_string(keys_.size(kMain)) + " g=" + std::to_string(keys_.size(kGhost));
  }

 private:
  using Keys = KeyLists<3>;
  enum : Keys::ListId { kSmall, kMain, kGhost };
  static constexpr uint32_t kMaxUses = 3;

  bool Pinned(const IsPinned& is_pinned, Keys::Node n) const {
    return is_pinned && is_pinned(keys_.key(n));
  }

  const size_t small_target_;
  const size_t ghost_limit_;
  Keys keys_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewS3FifoPolicy(size_t capacity_blocks) {
  return std::make_unique<S3FifoPolicy>(capacity_blocks);
}
}  // namespace kvoffload
