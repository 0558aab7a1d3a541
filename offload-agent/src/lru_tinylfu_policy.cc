// lru-tinylfu: LRU whose admission is filtered by access frequency wherever that wins.
//
// Most blocks a KV tier stores are never read again (three in four in Mooncake's production
// conversation trace), and the ones that are come back after more than a small tier's worth of
// new blocks, so plain LRU keeps the one-off blocks and evicts the re-read ones before their
// turn. TinyLFU (Einziger, Friedman and Manes, ACM ToS 2017) admits a new block only when its
// recent use count beats that of the block it would evict. The counts are approximate and
// remember keys evicted or never admitted: a doorkeeper Bloom filter takes each key's first
// use in a period, a 4-bit count-min sketch the uses after it, and both are aged every ten
// tier-fulls of calls (the sketch halved, the doorkeeper cleared) so that the past fades.
//
// Where blocks come back after a short gap (chat sessions at a larger tier) the filter throws
// away blocks LRU would have kept, so it is switched per workload: two miniature caches over
// one key in R (sampled by hash) with 1/R of the capacity (Waldspurger et al., ATC'17) run
// plain and filtered LRU side by side on the same counts, and the filter is on while the
// filtered one's recent hits beat the plain one's by a tenth. R is 4 up to 32K tier blocks,
// then grows so that each miniature keeps 4K-8K blocks: enough samples to compare, at a
// cost that vanishes for large tiers. With R = 8 on small tiers, or without the margin, the
// choice flipped on noise and cost up to 8% against LRU on Mooncake's synthetic trace.
//
// A block the filter refuses still becomes resident (the tier has stored it) but at the LRU
// end, so it is the next to go; one that is read in the meantime is moved up as usual.
//
// Memory: 12 bytes a tier block (sketch 8, doorkeeper 4; at most 48 MiB, for 4M blocks) and
// the two miniatures' key lists (at most 8K keys each).
// Cost: a plain LRU relink and two cache lines of counts, twice that for an insert while the
// filter is on, and on one call in R the same in each miniature.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "eviction_policies.h"
#include "huge_pages.h"
#include "key_list.h"
#include "key_sampler.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {


// Use counts of recent keys: the doorkeeper (a Bloom filter of 32 bits a tier block) holds each
// key's first use in the period, the sketch (4-bit counters, sixteen a tier block) the uses
// after it; a key's estimate is 0 when the doorkeeper lacks it, else 1 + the least of its four
// counters. Both are blocked, as Caffeine's sketch is: a key's three doorkeeper bits share one
// word and its four counters one 64-byte line, so a call costs two cache misses instead of
// seven (at 1M blocks a lookup took 400 ns with the bits and counters spread out). Sized from
// the measurements: at one counter a block per row, without a doorkeeper, the one-off blocks'
// collisions made every key look frequent, and the policy lost 22-31% against LRU on
// Mooncake's traces where exact counts gained up to 89%.
class FrequencySketch {
 public:
  // Sized for min(capacity, kMaxBlocks) blocks: a disk tier's capacity can be far more blocks
  // than it will ever hold, and the counts are allocated (and written) in full here. A larger
  // tier gets the 48 MiB of kMaxBlocks, with more collisions and a shorter memory.
  explicit FrequencySketch(size_t capacity) {
    const size_t blocks = std::min(capacity, kMaxBlocks);
    const size_t lines = std::bit_ceil(std::max<size_t>(1, blocks * 16 / kCountersPerLine));
    lines_.assign(lines, Line{});
    line_mask_ = lines - 1;
    const size_t door_words = std::bit_ceil(std::max<size_t>(1, blocks * 32 / 64));
    door_.assign(door_words, 0);
    door_mask_ = door_words - 1;
    age_after_ = 10 * static_cast<uint64_t>(blocks);
  }

  // Counts a use of the key whose hash is `hash`, and returns its estimate (Estimate) after it,
  // or 0 for its first use in the period, which reads no counters: the caller that needs the
  // estimate then asks Estimate. Waiting for the counters' line there cost inserts of new keys
  // 10-20 ns at 1M blocks, where the estimate is needed only while the filter is on.
  // Inlined: the call's own instructions delayed the next insert's cache misses (below).
  [[gnu::always_inline]] uint64_t Add(uint64_t hash) {
    if (++additions_ >= age_after_) {
      additions_ = 0;
      for (Line& line : lines_) {
        for (uint64_t& w : line.words) w = (w >> 1) & 0x7777777777777777ULL;
      }
      std::fill(door_.begin(), door_.end(), 0);
    }
    uint64_t& door = door_[DoorWord(hash)];
    const uint64_t bits = DoorBits(hash);
    if ((door & bits) != bits) {  // the key's first use in the period: the counters stay
      door |= bits;
      return 0;
    }
    Line& line = lines_[LineOf(hash)];
    uint64_t least = 0xf;
#pragma GCC unroll 4
    for (size_t i = 0; i < kCounters; ++i) {
      const auto [word, shift] = Counter(hash, i);
      const uint64_t count = (line.words[word] >> shift) & 0xf;
      const uint64_t step = count != 0xf;
      line.words[word] += step << shift;
      least = std::min(least, count + step);
    }
    return least + 1;
  }

  // Starts loading a key's doorkeeper word and counter line, so that their cache misses
  // overlap the key list's.
  void Prefetch(uint64_t hash) const {
    __builtin_prefetch(&door_[DoorWord(hash)]);
    __builtin_prefetch(&lines_[LineOf(hash)]);
  }

  uint64_t Estimate(uint64_t hash) const {
    const uint64_t bits = DoorBits(hash);
    if ((door_[DoorWord(hash)] & bits) != bits) return 0;
    return Least(lines_[LineOf(hash)], hash) + 1;
  }

 private:
  static constexpr size_t kMaxBlocks = size_t{1} << 22;
  static constexpr size_t kCounters = 4;           // a key's counters, in one line
  static constexpr size_t kCountersPerLine = 128;  // 8 words of sixteen 4-bit counters
  struct alignas(64) Line {
    uint64_t words[8] = {};
  };

  // The least of the key's counters in its line.
  static uint64_t Least(const Line& line, uint64_t hash) {
    uint64_t least = 0xf;
#pragma GCC unroll 4
    for (size_t i = 0; i < kCounters; ++i) {
      const auto [word, shift] = Counter(hash, i);
      least = std::min(least, (line.words[word] >> shift) & 0xf);
    }
    return least;
  }

  // Independent-looking bits of one hash for each choice: a multiply scatters them, and each
  // choice takes its own bits of the product.
  static uint64_t Mix(uint64_t hash) { return hash * 0x9E3779B97F4A7C15ULL; }
  size_t LineOf(uint64_t hash) const { return static_cast<size_t>(Mix(hash) >> 32) & line_mask_; }
  size_t DoorWord(uint64_t hash) const {
    return static_cast<size_t>((hash * 0xC2B2AE3D27D4EB4FULL) >> 32) & door_mask_;
  }
  static uint64_t DoorBits(uint64_t hash) {
    const uint64_t m = hash * 0xC2B2AE3D27D4EB4FULL;
    return (uint64_t{1} << (m & 63)) | (uint64_t{1} << ((m >> 6) & 63)) |
           (uint64_t{1} << ((m >> 12) & 63));
  }
  struct Position {
    size_t word;
    unsigned shift;
  };
  // Counter i of a key: in words 2i and 2i+1 of its line, so the four never share a word.
  static Position Counter(uint64_t hash, size_t i) {
    const uint64_t m = Mix(hash);
    const unsigned bits = static_cast<unsigned>(m >> (5 * i)) & 31;
    return {2 * i + (bits >> 4), (bits & 15) * 4};
  }

  // Huge pages (huge_pages.h): every call reads a line and a word of these at random.
  std::vector<Line, HugePageAllocator<Line>> lines_;
  size_t line_mask_ = 0;
  std::vector<uint64_t, HugePageAllocator<uint64_t>> door_;
  size_t door_mask_ = 0;
  uint64_t additions_ = 0;
  uint64_t age_after_ = 0;
};

// A small LRU over the sampled keys that counts its own recent hits (each older one weighing a
// little less), with or without the admission filter.
class Miniature {
 public:
  Miniature(size_t capacity, bool filtered)
      : capacity_(capacity), filtered_(filtered), keys_(capacity + 1) {}

  // A use of `key`, whose hash is `hash`.
  void Touch(const BlockKey& key, uint64_t hash, const FrequencySketch& sketch) {
    hits_ *= kDecay;
    if (const Keys::Node n = keys_.Find(key); n != Keys::kNone) {
      keys_.MoveToFront(kList, n);
      hits_ += 1;
      return;
    }
    const Keys::Node added = keys_.PushFront(kList, key);
    if (keys_.size(kList) <= capacity_) return;
    Keys::Node victim = keys_.back(kList);
    if (filtered_ &&
        sketch.Estimate(hash) <= sketch.Estimate(Keys::HashOf(keys_.key(victim)))) {
      victim = added;
    }
    keys_.Erase(victim);
  }
  double hits() const { return hits_; }

 private:
  using Keys = KeyLists<1>;
  static constexpr Keys::ListId kList = 0;
  // A hit 1000 sampled calls ago counts about a third of a new one.
  static constexpr double kDecay = 1.0 - 1.0 / 1024;

  const size_t capacity_;
  const bool filtered_;
  Keys keys_;
  double hits_ = 0;
};

class LruTinyLfuPolicy final : public EvictionPolicy {
 public:
  explicit LruTinyLfuPolicy(size_t capacity)
      : list_(capacity + 1),  // the tier inserts before it evicts
        sketch_(capacity),
        sampler_(capacity, kMinSampleShift, kMiniatureBlocks),
        plain_(sampler_.Scaled(capacity), false),
        filtered_(sampler_.Scaled(capacity), true) {}

  std::string_view name() const override { return "lru-tinylfu"; }

  // At 1M blocks an insert waits for its cache misses (the key's index slot, doorkeeper word
  // and counter line, all loaded from the start) and the CPU overlaps them with the next
  // insert's only as far as its reorder window reaches: an insert of fewer instructions is a
  // faster one. The sketch's update inlined, the key counted before it is linked (so that a
  // refused key is linked once, at its place) and the sketch on huge pages: at 1M blocks,
  // five alternating runs of `kvoffload-bench policy`, inserts in the loop row took 158-171 ns
  // against 198-201, of new keys 80-88 against 94-100.
  void OnInsert(const BlockKey& key) override {
    const uint64_t hash = Keys::HashOf(key);
    sketch_.Prefetch(hash);
    list_.PrefetchSlot(hash);
    uint64_t estimate = Count(key, hash);
    // Refused: linked behind the least recent block, the next victim.
    Keys::Node anchor = kList;  // the front
    if (filter_on_ && !list_.empty(kList)) {
      if (estimate == 0) estimate = sketch_.Estimate(hash);
      const Keys::Node lru = list_.back(kList);
      if (estimate <= sketch_.Estimate(Keys::HashOf(list_.key(lru)))) anchor = lru;
    }
    list_.PushAfter(anchor, key, hash);
  }
  void OnAccess(const BlockKey& key) override {
    const uint64_t hash = Keys::HashOf(key);
    sketch_.Prefetch(hash);
    Use(key, list_.Find(key, hash), hash);
  }
  void OnAccessBatch(std::span<const BlockKey> keys, std::span<const uint32_t>) override {
    list_.ForEachFound(
        keys, [this, keys](size_t i, Keys::Node n, uint64_t hash) { Use(keys[i], n, hash); },
        [this](uint64_t hash) { sketch_.Prefetch(hash); });
  }
  void OnRemove(const BlockKey& key) override {
    if (const Keys::Node n = list_.Find(key); n != Keys::kNone) list_.Erase(n);
  }
  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    return list_.PopLeastRecentUnpinned(kList, is_pinned);
  }
  size_t resident() const override { return list_.size(kList); }
  std::vector<BlockKey> EvictionOrder() const override { return list_.LeastRecentFirst(kList); }
  std::string DebugString() const override {
    return "lru-tinylfu n=" + std::to_string(list_.size(kList)) +
           " filter=" + (filter_on_ ? "on" : "off");
  }

 private:
  using Keys = KeyLists<1>;
  static constexpr Keys::ListId kList = 0;
  static constexpr double kFilterMargin = 1.1;

  // R: 4 (one key in four) up to 32K blocks, then enough that a miniature keeps fewer than
  // kMiniatureBlocks (4K-8K).
  static constexpr unsigned kMinSampleShift = 2;
  static constexpr size_t kMiniatureBlocks = 8192;

  // A use of `key` (node n, kNone when not resident; hash: Keys::HashOf(key)).
  void Use(const BlockKey& key, Keys::Node n, uint64_t hash) {
    if (n != Keys::kNone) list_.MoveToFront(kList, n);
    Count(key, hash);
  }
  // Counts a use of `key` (whose hash is `hash`) in the sketch and, for sampled keys, in both
  // miniature caches, which then decide the filter. Returns what the sketch's Add returns.
  uint64_t Count(const BlockKey& key, uint64_t hash) {
    const uint64_t estimate = sketch_.Add(hash);
    if (sampler_.Sampled(hash)) {
      plain_.Touch(key, hash, sketch_);
      filtered_.Touch(key, hash, sketch_);
      filter_on_ = filtered_.hits() > plain_.hits() * kFilterMargin;
    }
    return estimate;
  }

  Keys list_;
  FrequencySketch sketch_;
  const KeySampler sampler_;
  Miniature plain_;
  Miniature filtered_;
  bool filter_on_ = false;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLruTinyLfuPolicy(size_t capacity_blocks) {
  return std::make_unique<LruTinyLfuPolicy>(capacity_blocks);
}
}  // namespace kvoffload
