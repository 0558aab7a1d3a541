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
//
// Layout, for a million blocks (far beyond the caches, where an operation costs its chain of
// dependent cache misses): every key, resident or ghost, has one 24-byte entry in an
// open-addressing table that holds the key itself, its queue and its use count. A lookup is
// one miss (KeyLists, which the list-based policies use, needs the slot, then the node). The
// queues are rings, read and written in order, and an entry records its position in its
// queue's ring: a ring position belongs to the one entry that names that queue and position,
// so the ring keeps only what finds the entry's home slot (4 bytes of the key's hash), and a
// position whose key has since moved or left (removed, or a ghost stored again) is found
// stale and skipped. Popping a ring is one miss on the entry; the entries of the next
// positions are prefetched while it is served, so consecutive evictions overlap their misses.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "eviction_policies.h"
#include "huge_pages.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  // Resident blocks (capacity, one more while an insert waits for its eviction) and the ghosts
  // (as many as M holds). REQUIRES: capacity > 0 (the factory refuses 0), so S's target fits.
  explicit S3FifoPolicy(size_t capacity)
      : small_target_(std::max<size_t>(1, capacity / 10)),
        ghost_limit_(capacity - small_target_ + 1) {
    // Room for every key the policy can hold, so that the steady state never rehashes (tens of
    // milliseconds at a million keys, under the tier's lock). Not beyond kMaxReservedKeys (a
    // 96 MiB table): a disk tier's capacity can be far more blocks than it will ever hold;
    // more still fit, by growing.
    const size_t keys = std::min(capacity + 1 + ghost_limit_, kMaxReservedKeys);
    size_t slots = kMinSlots;
    while (keys > slots / 2) slots *= 2;
    Rehash(slots);
  }

  std::string_view name() const override { return "s3fifo"; }

  void OnInsert(const BlockKey& key) override {
    const uint32_t tag = Tag(key);
    Entry* e = Find(key, tag);
    if (e == nullptr) {
      e = Emplace(key, tag);
      Enqueue(kSmall, *e, tag);
    } else if (e->queue == kGhost) {
      --ring(kGhost).live;
      e->uses = 0;
      Enqueue(kMain, *e, tag);
      MaybeCompact(kGhost);
    }
  }
  void OnAccess(const BlockKey& key) override {
    Entry* e = Find(key, Tag(key));
    if (e != nullptr && e->queue != kGhost) {
      e->uses = static_cast<uint8_t>(std::min<uint32_t>(e->uses + 1u, kMaxUses));
    }
  }
  void OnRemove(const BlockKey& key) override {
    Entry* e = Find(key, Tag(key));
    if (e == nullptr || e->queue == kGhost) return;
    const Queue q = e->queue;
    --ring(q).live;
    Erase(e);
    MaybeCompact(q);
  }

  std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) override {
    // Pinned blocks go back to their queue's front; a queue whose blocks were all passed over
    // as pinned, one after another, is not tried again in this call.
    size_t pinned_small = 0;
    size_t pinned_main = 0;
    // Each block of M is passed at most kMaxUses + 1 times before it goes (its count drops on
    // every pass), each block of S once before it moves to M or leaves.
    for (size_t budget = (kMaxUses + 2) * (resident() + 1); budget > 0; --budget) {
      const size_t small = ring(kSmall).live;
      const size_t main = ring(kMain).live;
      const bool small_usable = small > 0 && pinned_small < small;
      const bool main_usable = main > 0 && pinned_main < main;
      if (!small_usable && !main_usable) return std::nullopt;
      if (small_usable && (small > small_target_ || !main_usable)) {
        uint32_t tag = 0;
        Entry& e = PopLive(kSmall, tag);
        if (Pinned(is_pinned, e)) {
          Enqueue(kSmall, e, tag);
          ++pinned_small;
        } else if (e.uses > 0) {
          e.uses = 0;
          Enqueue(kMain, e, tag);
          pinned_main = 0;  // M's pinned blocks now come round again behind a usable one
        } else {
          const BlockKey victim = e.key;
          Enqueue(kGhost, e, tag);
          while (ring(kGhost).live > ghost_limit_) Erase(&PopLive(kGhost, tag));
          return victim;
        }
      } else {
        uint32_t tag = 0;
        Entry& e = PopLive(kMain, tag);
        if (Pinned(is_pinned, e)) {
          Enqueue(kMain, e, tag);
          ++pinned_main;
        } else if (e.uses > 0) {
          --e.uses;
          Enqueue(kMain, e, tag);
          pinned_main = 0;  // counted again when passed again: it counts distinct blocks
        } else {
          const BlockKey victim = e.key;
          Erase(&e);
          return victim;
        }
      }
    }
    return std::nullopt;
  }

  size_t resident() const override { return ring(kSmall).live + ring(kMain).live; }
  std::vector<BlockKey> EvictionOrder() const override {
    // Approximation for inspection: S then M, oldest first, ignoring the use counts.
    std::vector<BlockKey> out;
    out.reserve(resident());
    for (const Queue q : {kSmall, kMain}) {
      const Ring& r = ring(q);
      for (uint32_t p = r.head; p != r.tail; ++p) {
        if (const Entry* e = LiveAt(q, p)) out.push_back(e->key);
      }
    }
    return out;
  }
  std::string DebugString() const override {
    return "s3fifo s=" + std::to_string(ring(kSmall).live) +
           " m=" + std::to_string(ring(kMain).live) + " g=" + std::to_string(ring(kGhost).live);
  }

 private:
  enum Queue : uint8_t { kFree, kSmall, kMain, kGhost };
  static constexpr uint32_t kMaxUses = 3;
  static constexpr size_t kMinSlots = 16;
  static constexpr size_t kMaxReservedKeys = size_t{1} << 21;
  // How many ring positions ahead of the one being popped have their entries prefetched: at
  // 1M blocks 8 was at least as fast as 4, and without it evictions took twice as long.
  static constexpr uint32_t kPrefetchAhead = 8;

  struct Entry {
    BlockKey key;
    uint32_t seq;  // its position in its queue's ring
    Queue queue;   // kFree: an empty slot
    uint8_t uses;
  };
  static_assert(sizeof(Entry) == 24);

  // A queue: positions count up for ever (modulo 2^32); position p is tags[p & mask], the top
  // 32 bits of its key's hash. Positions whose entry is elsewhere are stale; `live` counts the
  // others.
  struct Ring {
    std::vector<uint32_t> tags = std::vector<uint32_t>(16);
    uint32_t mask = 15;
    uint32_t head = 0;
    uint32_t tail = 0;
    size_t live = 0;
  };

  Ring& ring(Queue q) { return rings_[q - kSmall]; }
  const Ring& ring(Queue q) const { return rings_[q - kSmall]; }

  static uint32_t Tag(const BlockKey& key) {
    return static_cast<uint32_t>(static_cast<uint64_t>(BlockKeyHash{}(key)) >> 32);
  }
  // The home slot is the tag's top bits.
  size_t Home(uint32_t tag) const { return tag >> shift_; }

  Entry* Find(const BlockKey& key, uint32_t tag) {
    for (size_t i = Home(tag);; i = (i + 1) & mask_) {
      Entry& e = table_[i];
      if (e.queue == kFree) return nullptr;
      if (e.key == key) return &e;
    }
  }
  // REQUIRES: key has no entry. The entry's queue is set by the caller (Enqueue).
  Entry* Emplace(const BlockKey& key, uint32_t tag) {
    if (count_ + 1 > (mask_ + 1) / 2) Rehash(2 * (mask_ + 1));
    ++count_;
    return Place(key, tag);
  }
  Entry* Place(const BlockKey& key, uint32_t tag) {
    size_t i = Home(tag);
    while (table_[i].queue != kFree) i = (i + 1) & mask_;
    table_[i].key = key;
    table_[i].uses = 0;
    return &table_[i];
  }
  // Backward-shift deletion: later entries of the probe run move up into the hole, so that no
  // tombstones pile up under the constant insert/erase churn of a full cache.
  void Erase(Entry* e) {
    size_t hole = static_cast<size_t>(e - table_.data());
    for (size_t j = (hole + 1) & mask_; table_[j].queue != kFree; j = (j + 1) & mask_) {
      // The entry at j may fill the hole only if the hole lies on its probe path (home .. j).
      if (((j - Home(Tag(table_[j].key))) & mask_) >= ((j - hole) & mask_)) {
        table_[hole] = table_[j];
        hole = j;
      }
    }
    table_[hole] = Entry{};
    --count_;
  }
  void Rehash(size_t slots) {
    // The home is taken from a 32-bit tag.
    if (slots > (size_t{1} << 32)) throw std::length_error("s3fifo: too many keys");
    std::vector<Entry, HugePageAllocator<Entry>> old = std::move(table_);
    table_.assign(slots, Entry{});
    mask_ = slots - 1;
    shift_ = 32 - std::countr_zero(slots);
    for (const Entry& e : old) {
      if (e.queue != kFree) *Place(e.key, Tag(e.key)) = e;
    }
  }

  // Appends e (whose key's tag is `tag`) to q's ring and records the position in e.
  void Enqueue(Queue q, Entry& e, uint32_t tag) {
    Ring& r = ring(q);
    if (r.tail - r.head == r.mask + 1) Grow(r);
    r.tags[r.tail & r.mask] = tag;
    e.queue = q;
    e.seq = r.tail++;
    ++r.live;
  }
  static void Grow(Ring& r) {
    const uint32_t size = r.mask + 1;
    if (size > (uint32_t{1} << 30)) throw std::length_error("s3fifo: queue too long");
    std::vector<uint32_t> tags(2 * size);
    for (uint32_t p = r.head; p != r.tail; ++p) tags[p & (2 * size - 1)] = r.tags[p & r.mask];
    r.tags = std::move(tags);
    r.mask = 2 * size - 1;
  }
  // The entry whose live position in q is p, or null when p is stale: the one entry naming q
  // and p, on the probe path from the home of p's tag.
  const Entry* LiveAt(Queue q, uint32_t p) const {
    const Ring& r = ring(q);
    for (size_t i = Home(r.tags[p & r.mask]);; i = (i + 1) & mask_) {
      const Entry& e = table_[i];
      if (e.queue == kFree) return nullptr;
      if (e.queue == q && e.seq == p) return &e;
    }
  }
  Entry* LiveAt(Queue q, uint32_t p) {
    return const_cast<Entry*>(std::as_const(*this).LiveAt(q, p));
  }
  // Takes q's oldest live position off the ring and returns its entry, which still names q
  // until the caller enqueues or erases it, and its tag. REQUIRES: ring(q).live > 0.
  Entry& PopLive(Queue q, uint32_t& tag) {
    Ring& r = ring(q);
    for (;;) {
      const uint32_t p = r.head++;
      if (r.tail - p > kPrefetchAhead) {
        // The home slot and the two after it: the probe run, and the line an erase shifts
        // entries up from, often reach into the next cache line (entries are 24 bytes).
        const size_t home = Home(r.tags[(p + kPrefetchAhead) & r.mask]);
        __builtin_prefetch(&table_[home]);
        __builtin_prefetch(&table_[(home + 2) & mask_]);
      }
      if (Entry* e = LiveAt(q, p)) {
        --r.live;
        tag = r.tags[p & r.mask];
        return *e;
      }
    }
  }
  // Positions left stale by OnRemove and by ghosts stored again are dropped when the ring
  // reaches them; where they pile up faster (removals without evictions), the ring is
  // rewritten without them once they outnumber the live ones, which keeps its length within
  // twice the live count (and the rewriting, O(length), amortised over the removals).
  void MaybeCompact(Queue q) {
    Ring& r = ring(q);
    if (r.tail - r.head <= 2 * r.live + 64) return;
    uint32_t out = r.head;
    for (uint32_t p = r.head; p != r.tail; ++p) {
      if (Entry* e = LiveAt(q, p)) {
        r.tags[out & r.mask] = r.tags[p & r.mask];
        e->seq = out++;
      }
    }
    r.tail = out;
  }

  bool Pinned(const IsPinned& is_pinned, const Entry& e) const {
    return is_pinned && is_pinned(e.key);
  }

  const size_t small_target_;
  const size_t ghost_limit_;
  // Every key's entry (huge_pages.h); an all-zero entry is a free slot.
  std::vector<Entry, HugePageAllocator<Entry>> table_;
  size_t mask_ = 0;
  int shift_ = 0;
  size_t count_ = 0;  // occupied slots: resident and ghost keys
  Ring rings_[3];     // S, M, G
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewS3FifoPolicy(size_t capacity_blocks) {
  return std::make_unique<S3FifoPolicy>(capacity_blocks);
}
}  // namespace kvoffload
