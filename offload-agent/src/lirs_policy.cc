// lirs: LIRS (Jiang and Zhang, SIGMETRICS 2002) whose share of the tier for once-used blocks
// follows the traffic, down to plain LRU where that wins.
//
// LIRS ranks a block by its reuse distance (how many other blocks were used between its last
// two uses) instead of by how long ago it was last used. Blocks whose last reuse came quickly
// (LIR) keep most of the tier; every other resident block (HIR) waits in a small FIFO, and a
// block evicted from it is remembered (a ghost). A HIR block, resident or ghost, that is used
// again while its previous use is more recent than the least recent LIR block's has proved a
// shorter reuse distance than that LIR block: it becomes LIR and the least recent LIR block
// becomes HIR. On KV traffic this keeps a fixed set of the prompts and sessions that come back
// when more of them are open than the tier holds, where LRU evicts each just before its
// return: RAG documents at 2-5% of the distinct blocks (0.90 of Belady's OPT, LRU 0.78-0.83)
// and Mooncake's production chat trace at 2% (1.85x LRU's prefix hits).
//
// The usual form keeps every block in a recency stack and prunes it; here each key is in
// exactly one of three lists (LIR by recency, HIR by arrival, ghosts by eviction) and carries
// the time of its last use (a 32-bit count of calls, in KeyLists' spare bytes), so "its last
// use is more recent than the least recent LIR block's" is one comparison with the LIR list's
// end, and the stack needs no pruning. Ghosts are kept while that comparison could still
// promote them, at most eight tier-fulls of them and 4M: RAG's documents come back after many
// tier-fulls of other blocks (with three, RAG at 2-5% reached 0.89 of OPT instead of 0.90;
// with one, Mooncake's chat trace at 2% lost a quarter of its gain).
//
// Where reuse distances do not predict the next use (chat sessions with exponential think times at
// a tier of 10% of the distinct blocks), a fixed 1-10% HIR share fell 3-16% below LRU. So the share
// is chosen per workload, like lru-tinylfu's filter: four miniature caches over one key in R
// (sampled by hash) with 1/R of the capacity (Waldspurger et al., ATC'17) run LIRS with HIR shares
// of 100% (which is LRU: no LIR block, so nothing is promoted and the FIFO moves a used block to
// its new end), 25%, 10% and 2%, and the tier follows the one that beats the current one on the
// sampled calls where one of the two hit and the other missed, by more than chance would give (3
// standard deviations), counted over windows of 4096 sampled calls (each window's counts halved
// into the next). It starts as LRU, and where no share is better it stays so. A share raised
// after the tier has been full leaves LIR short, and LIR is then refilled by blocks that are
// used again (resident HIR blocks and ghosts), not by the blocks stored next, which in KV
// traffic are mostly never read again. R is 2 up to 16K tier blocks, then grows so that a
// miniature keeps 4K-8K blocks: with R = 4 at small tiers, the miniatures of Mooncake's
// synthetic trace at 2-5% (200-500 blocks) counted a few dozen hits a window, chose on noise,
// and fell 3-4% below LRU.
//
// Memory: 48 bytes a key (a 32-byte node and its index slots) for each tier block and ghost:
// up to 9 keys a tier block, at most 4M ghosts (at a million blocks, up to 240 MiB, 0.01% of
// the bytes of 2 MiB KV blocks), and the miniatures' (at most 72K keys each).
// Cost: a list relink and a read of the LIR list's end, and on one call in R the same in each
// miniature; switching the share demotes at most two LIR blocks a call until the new share.
//
// A block idle for 2^31 calls (over half an hour at a million calls a second) may be taken for
// a recent one, which decides only its list, never whether it may be evicted.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eviction_policies.h"
#include "key_list.h"
#include "key_sampler.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

// LIRS over `capacity` resident blocks and their ghosts.
class Lirs {
 public:
  using Keys = KeyLists<3>;
  using Node = Keys::Node;
  static constexpr Node kNone = Keys::kNone;

  explicit Lirs(size_t capacity)
      : ghost_limit_(std::min(kGhostTierFulls * capacity, kMaxGhosts)),
        keys_(capacity + 1 + ghost_limit_) {}  // the tier inserts before it evicts

  // Resident LIR blocks the tier aims at; the rest of it is HIR. Lowered, it is reached a
  // couple of demotions a call (Rebalance).
  void set_lir_target(size_t blocks) { lir_target_ = blocks; }

  // A resident key's node, or kNone (unknown or a ghost). `hash` is Keys::HashOf(key).
  Node FindResident(const BlockKey& key, uint64_t hash) const {
    const Node n = keys_.Find(key, hash);
    return n != kNone && keys_.list(n) != kGhost ? n : kNone;
  }

  // REQUIRES: key not resident. `hash` is Keys::HashOf(key).
  void Insert(const BlockKey& key, uint64_t hash) {
    // A stored block is often promoted (a ghost) or LIR (a new tier), and either way
    // Rebalance then demotes the least recent LIR block: loading its neighbour now overlaps
    // that miss with the key's own. Alternating runs at 1M blocks, a loop of 1.5x the tier:
    // inserts 223-285 ns without, 160-180 with. (In Access, where LIR hits rarely demote, it
    // bought nothing.)
    if (!keys_.empty(kLir)) keys_.PrefetchBeforeBack(kLir);
    const uint32_t now = ++clock_;
    Node n = keys_.Find(key, hash);
    if (n != kNone) {
      // A ghost: LIR when its last use is within the LIR blocks' recency, as if it had stayed,
      // or while LIR is short of its share.
      keys_.MoveToFront(Promotes(n) ? kLir : kHir, n);
    } else {
      // A new tier fills LIR first with whatever comes, as LIRS does. Once the tier has been
      // full, a LIR set short of its share (the share was just raised) is refilled by blocks
      // that prove a reuse (Promotes) and never by new ones: most blocks a KV tier stores are
      // never read again, and LIR keeps what it is given until it is the least recent LIR.
      const bool lir = !evicted_ && keys_.size(kLir) < lir_target_;
      n = keys_.PushFront(lir ? kLir : kHir, key, hash);
    }
    keys_.set_stamp(n, now);
    Rebalance();
  }
  // REQUIRES: n is resident.
  void Access(Node n) {
    const uint32_t now = ++clock_;
    keys_.MoveToFront(keys_.list(n) == kLir || Promotes(n) ? kLir : kHir, n);
    keys_.set_stamp(n, now);
    Rebalance();
  }
  // REQUIRES: n is resident.
  void Erase(Node n) { keys_.Erase(n); }
  // visit(i, node or kNone, hash) for each key, as FindResident would give them, with the
  // lookups of the keys ahead overlapped (KeyLists::ForEachFound).
  template <typename Visit>
  void ForEachResident(std::span<const BlockKey> keys, Visit&& visit) {
    keys_.ForEachFound(keys, [&](size_t i, Node n, uint64_t hash) {
      visit(i, n != kNone && keys_.list(n) != kGhost ? n : kNone, hash);
    });
  }

  // The oldest unpinned HIR block (the oldest LIR one when every HIR block is pinned), now a
  // ghost.
  std::optional<BlockKey> Evict(const EvictionPolicy::IsPinned& is_pinned) {
    Node n = keys_.LeastRecentUnpinned(kHir, is_pinned);
    if (n == kNone) n = keys_.LeastRecentUnpinned(kLir, is_pinned);
    if (n == kNone) return std::nullopt;
    const BlockKey victim = keys_.key(n);
    evicted_ = true;
    if (lir_target_ == 0 && keys_.empty(kLir)) {
      // Its LRU mode (no LIR block, and a share that wants none): no ghost could be promoted,
      // so none is kept (those left are forgotten a few a call), and the victim leaves at
      // once instead of passing through the ghost list: evictions at 1M blocks 146-152 ns
      // against 149-153 (five alternating pairs), the same hits on every trace shape.
      keys_.Erase(n);
      ForgetGhosts();
      return victim;
    }
    keys_.MoveToFront(kGhost, n);
    ForgetGhosts();
    return victim;
  }

  size_t resident() const { return keys_.size(kLir) + keys_.size(kHir); }
  size_t size(Keys::ListId l) const { return keys_.size(l); }
  // Next victim first (ignoring pins): HIR blocks, then LIR blocks, oldest first.
  std::vector<BlockKey> EvictionOrder() const {
    std::vector<BlockKey> out = keys_.LeastRecentFirst(kHir);
    keys_.AppendLeastRecentFirst(kLir, out);
    return out;
  }

  static constexpr Keys::ListId kLir = 0;
  static constexpr Keys::ListId kHir = 1;
  static constexpr Keys::ListId kGhost = 2;

 private:
  static constexpr size_t kGhostTierFulls = 8;
  static constexpr size_t kMaxGhosts = size_t{1} << 22;
  static constexpr size_t kDemotionsPerCall = 2;
  static constexpr size_t kGhostsForgottenPerCall = 4;

  // Whether n's last use is more recent than the least recent LIR block's (LIRS: n is in the
  // stack). Ages are counted back from now, modulo 2^32.
  bool InLirRecency(Node n) const {
    if (keys_.empty(kLir)) return false;
    return clock_ - keys_.stamp(n) < clock_ - keys_.stamp(keys_.back(kLir));
  }
  // Whether a HIR block or ghost that is used again becomes LIR.
  bool Promotes(Node n) const { return keys_.size(kLir) < lir_target_ || InLirRecency(n); }
  // Ghosts that would come back as HIR anyway (older than the LIR blocks' recency, with LIR
  // at its share; all of them in LRU mode) are forgotten, oldest first, a few a call beyond the
  // limit: when the share drops, or LRU mode begins, nearly every ghost qualifies at once, and
  // forgetting millions in one call held the tier's lock for 110 ms (500K blocks). One that
  // comes back before its turn is placed by Promotes as it stands then.
  void ForgetGhosts() {
    for (size_t forgotten = 0; !keys_.empty(kGhost); ++forgotten) {
      const Node g = keys_.back(kGhost);
      if (keys_.size(kGhost) <= ghost_limit_ &&
          (forgotten >= kGhostsForgottenPerCall || Promotes(g))) {
        break;
      }
      keys_.Erase(g);
    }
  }
  // The least recent LIR blocks become the newest HIR ones while LIR is over its share.
  void Rebalance() {
    for (size_t i = 0; i < kDemotionsPerCall && keys_.size(kLir) > lir_target_; ++i) {
      keys_.MoveToFront(kHir, keys_.back(kLir));
    }
  }

  const size_t ghost_limit_;
  Keys keys_;
  size_t lir_target_ = 0;
  uint32_t clock_ = 0;
  bool evicted_ = false;  // the tier has been full
};

class LirsPolicy final : public EvictionPolicy {
 public:
  explicit LirsPolicy(size_t capacity)
      : capacity_(capacity),
        main_(capacity),
        sampler_(capacity, kMinSampleShift, kMiniatureBlocks),
        mini_capacity_(sampler_.Scaled(capacity)) {
    for (size_t i = 0; i < kShares.size(); ++i) {
      minis_[i].lirs = std::make_unique<Lirs>(mini_capacity_);
      minis_[i].lirs->set_lir_target(LirTarget(mini_capacity_, i));
    }
    main_.set_lir_target(LirTarget(capacity_, share_));
  }

  std::string_view name() const override { return "lirs"; }

  void OnInsert(const BlockKey& key) override {
    const uint64_t hash = Lirs::Keys::HashOf(key);
    main_.Insert(key, hash);
    Sample(key, hash);
  }
  // The key's own lookup goes first and the sampling after it: at a million blocks a call is
  // its chain of cache misses, which the CPU overlaps with the next calls' only as far as
  // their instructions fit in its window. Sampling first (and hashing the key twice) cost
  // about 25 ns more a lookup (alternating runs at 1M blocks: 189-216 against 172-201 ns).
  void OnAccess(const BlockKey& key) override {
    const uint64_t hash = Lirs::Keys::HashOf(key);
    Use(key, main_.FindResident(key, hash), hash);
  }
  void OnAccessBatch(std::span<const BlockKey> keys, std::span<const uint32_t>) override {
    main_.ForEachResident(
        keys, [&](size_t i, Lirs::Node n, uint64_t hash) { Use(keys[i], n, hash); });
  }
  void OnRemove(const BlockKey& key) override {
    const Lirs::Node n = main_.FindResident(key, Lirs::Keys::HashOf(key));
    if (n != Lirs::kNone) main_.Erase(n);
  }
  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    return main_.Evict(is_pinned);
  }
  size_t resident() const override { return main_.resident(); }
  std::vector<BlockKey> EvictionOrder() const override { return main_.EvictionOrder(); }
  std::string DebugString() const override {
    char share[16];
    std::snprintf(share, sizeof(share), "%.2f", kShares[share_]);
    return "lirs hir-share=" + std::string(share) +
           " lir=" + std::to_string(main_.size(Lirs::kLir)) +
           " hir=" + std::to_string(main_.size(Lirs::kHir)) +
           " ghosts=" + std::to_string(main_.size(Lirs::kGhost));
  }

 private:
  // HIR shares the miniatures try; the first, where the tier starts, is LRU.
  static constexpr std::array<double, 4> kShares = {1.0, 0.25, 0.10, 0.02};
  // A switch needs the other share's lead over the current one, on the sampled calls where
  // exactly one of the two miniatures hit, to be kZ standard deviations of what chance would
  // give two equal shares on those calls (McNemar's test for paired outcomes).
  static constexpr double kZ = 3.0;
  static constexpr uint64_t kWindow = 4096;
  // R: 2 (one key in two) up to 16K blocks, then enough that a miniature keeps fewer than
  // kMiniatureBlocks (4K-8K).
  static constexpr unsigned kMinSampleShift = 1;
  static constexpr size_t kMiniatureBlocks = 8192;

  struct Miniature {
    std::unique_ptr<Lirs> lirs;  // Lirs has no default state for the array to start from
    double wins = 0;    // sampled calls it hit and the current share's miniature missed
    double losses = 0;  // and the other way round
  };
  static size_t LirTarget(size_t capacity, size_t share) {
    const auto hir = static_cast<size_t>(static_cast<double>(capacity) * kShares[share]);
    return capacity - std::clamp<size_t>(hir, 1, capacity);
  }

  // A use of `key` (its node n, kNone when not resident; hash: Lirs::Keys::HashOf(key)).
  void Use(const BlockKey& key, Lirs::Node n, uint64_t hash) {
    if (n != Lirs::kNone) main_.Access(n);
    Sample(key, hash);
  }
  // A use of `key`: for one key in R, also a use in each miniature, which then choose the
  // tier's share.
  void Sample(const BlockKey& key, uint64_t hash) {
    if (!sampler_.Sampled(hash)) return;
    std::array<bool, kShares.size()> hit{};
    for (size_t i = 0; i < kShares.size(); ++i) {
      Miniature& m = minis_[i];
      if (const Lirs::Node n = m.lirs->FindResident(key, hash); n != Lirs::kNone) {
        m.lirs->Access(n);
        hit[i] = true;
      } else {
        m.lirs->Insert(key, hash);
        while (m.lirs->resident() > mini_capacity_) m.lirs->Evict(nullptr);
      }
    }
    // The miniatures see the same sampled calls, so their hit counts move together: what
    // tells two shares apart is the calls one hit and the other missed.
    for (size_t i = 0; i < kShares.size(); ++i) {
      if (hit[i] && !hit[share_]) minis_[i].wins += 1;
      if (!hit[i] && hit[share_]) minis_[i].losses += 1;
    }
    if (++sampled_ % kWindow != 0) return;
    size_t best = share_;
    double best_lead = 0;
    for (size_t i = 0; i < kShares.size(); ++i) {
      const Miniature& m = minis_[i];
      const double lead = m.wins - m.losses;
      if (lead > best_lead && lead * lead > kZ * kZ * (m.wins + m.losses)) {
        best = i;
        best_lead = lead;
      }
    }
    for (Miniature& m : minis_) {
      m.wins /= 2;
      m.losses /= 2;
    }
    if (best != share_) {
      share_ = best;
      // The counts were against the old share.
      for (Miniature& m : minis_) m.wins = m.losses = 0;
      main_.set_lir_target(LirTarget(capacity_, share_));
    }
  }

  const size_t capacity_;
  Lirs main_;
  const KeySampler sampler_;
  const size_t mini_capacity_;
  std::array<Miniature, kShares.size()> minis_;
  size_t share_ = 0;
  uint64_t sampled_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLirsPolicy(size_t capacity_blocks) {
  return std::make_unique<LirsPolicy>(capacity_blocks);
}
}  // namespace kvoffload
