// Ordered lists of block keys with O(1) find, move-to-front and erase: what the LRU and ARC
// policies are built from. Not thread-safe.
//
// At a million keys all of this is far beyond the caches (on the shared 2-core bench machine a
// few MiB of L3 are ours, and a dependent miss takes about 160 ns), so an operation costs what
// its chain of dependent misses costs. std::list + std::unordered_map chained four or five:
// bucket, hash node, list node, its neighbours, each its own allocation. Here the list nodes
// live in one slab addressed by 32-bit indices and the key index is an open-addressing table of
// 8-byte slots, so a lookup is a miss on the slot, then one on the node (whose key confirms the
// match), then the node's two neighbours in parallel. All lists of a policy share the slab and
// the index: moving a key between lists (ARC's T1 -> T2 on a hit, T -> B on an eviction)
// touches no index at all, and ARC finds a key with one probe where it probed up to four maps.
#ifndef KVOFFLOAD_SRC_KEY_LIST_H_
#define KVOFFLOAD_SRC_KEY_LIST_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

#include "huge_pages.h"
#include "kvoffload/block_key.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {

// kLists lists over one set of keys; a key is in at most one of them. Front = most recent,
// back = least recent.
template <size_t kLists>
class KeyLists {
 public:
  using Node = uint32_t;    // a key's place in the slab; stable while the key is in a list
  using ListId = uint32_t;  // 0 .. kLists-1
  static constexpr Node kNone = std::numeric_limits<Node>::max();

  // expected_keys: the most keys the owner will hold. Room for them is made now, so that the
  // steady state never pays for growing (a rehash at a million keys takes tens of milliseconds
  // under the tier's lock); more still fit, by growing.
  explicit KeyLists(size_t expected_keys) {
    // Not beyond kMaxReservedKeys: a disk tier's capacity can be far more blocks than it will
    // ever hold, and the index is written (so paid for) in full when it is made.
    const size_t keys = std::min(expected_keys, kMaxReservedKeys);
    nodes_.reserve(kLists + keys);
    // Node l is list l's sentinel: the lists are circular through it, so linking and unlinking
    // never branch on a list end.
    for (ListId l = 0; l < kLists; ++l) nodes_.push_back(NodeData{{}, l, l, l, 0});
    size_t slots = kMinSlots;
    while (!FitsInTable(keys, slots)) slots *= 2;
    ResizeTable(slots);
  }

  // The key's hash as the index uses it (its top 32 bits are the slot tag), for callers that
  // need one of their own too and pass it to Find instead of hashing twice.
  static uint64_t HashOf(const BlockKey& key) { return static_cast<uint64_t>(BlockKeyHash{}(key)); }

  size_t size(ListId l) const { return sizes_[l]; }
  bool empty(ListId l) const { return sizes_[l] == 0; }

  // kNone when the key is in no list.
  Node Find(const BlockKey& key) const { return Find(key, HashOf(key)); }
  // The same, for a caller that has the key's hash (HashOf) for its own use too.
  Node Find(const BlockKey& key, uint64_t hash) const {
    const auto tag = static_cast<uint32_t>(hash >> 32);
    for (size_t i = Home(tag);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.node == kNone) return kNone;
      if (s.tag == tag && nodes_[s.node].key == key) return s.node;
    }
  }
  ListId list(Node n) const { return nodes_[n].list; }
  // A word the owner keeps per key, in the node's spare bytes (so reading it costs no miss of
  // its own); LIRS keeps the time of the key's last use there. 0 for a new key.
  uint32_t stamp(Node n) const { return nodes_[n].stamp; }
  void set_stamp(Node n, uint32_t stamp) { nodes_[n].stamp = stamp; }
  const BlockKey& key(Node n) const { return nodes_[n].key; }
  // The least recent key of l. REQUIRES: !empty(l).
  Node back(ListId l) const { return nodes_[l].prev; }

  // Starts loading the node before l's least recent one, which taking the least recent key
  // off l (a demotion, an eviction) relinks: one dependent miss at a million keys, overlapped
  // this way with the caller's own. REQUIRES: l holds at least one key.
  void PrefetchBeforeBack(ListId l) const {
    __builtin_prefetch(&nodes_[nodes_[nodes_[l].prev].prev]);
  }

  // Starts loading the index slot where the key whose hash (HashOf) is `hash` is found or
  // placed: the first of its misses, overlapped this way with the caller's own.
  void PrefetchSlot(uint64_t hash) const {
    __builtin_prefetch(&slots_[Home(static_cast<uint32_t>(hash >> 32))]);
  }

  // Calls visit(i, Find(keys[i]), hash of keys[i]) for each key in order, while the index
  // slots, nodes and neighbours of the keys 3 kStage, 2 kStage and kStage places after the
  // one visited load: at a million keys a lookup is three dependent misses (slot, node,
  // neighbours), which one key at a time the CPU can barely overlap with the next key's. What
  // it loads ahead are hints only (visit may relink anything): each Find is made when its
  // key's turn comes. ahead(hash) runs when a key's slot starts loading, for an owner with
  // lines of its own to load (lru-tinylfu's counts).
  template <typename Visit, typename Ahead = void (*)(uint64_t)>
  void ForEachFound(std::span<const BlockKey> keys, Visit&& visit,
                    Ahead&& ahead = [](uint64_t) {}) {
    // Chains of 16 at 1M keys (kvoffload-bench policy, three runs each): lookups of lru
    // 66-74 ns with a stage of 2, 55-59 with 4, 49-51 with 8; lirs 79-88, 66-68, 60-63.
    constexpr size_t kStage = 8;
    constexpr size_t kRing = 32;  // the keys between the first stage and the visit
    static_assert(kRing > 3 * kStage);
    std::array<uint64_t, kRing> hashes;
    std::array<Node, kRing> candidates;  // found in the second stage, used in the third
    const size_t n = keys.size();
    for (size_t i = 0; i < n + 3 * kStage; ++i) {
      if (i < n) {
        const uint64_t h = HashOf(keys[i]);
        hashes[i % kRing] = h;
        __builtin_prefetch(&slots_[Home(static_cast<uint32_t>(h >> 32))]);
        ahead(h);
      }
      if (i >= kStage && i - kStage < n) {
        const size_t j = (i - kStage) % kRing;
        candidates[j] = Candidate(hashes[j]);
        if (candidates[j] != kNone) __builtin_prefetch(&nodes_[candidates[j]]);
      }
      if (i >= 2 * kStage && i - 2 * kStage < n) {
        // A hint: visits since the second stage may have erased it (its node still exists).
        if (const Node c = candidates[(i - 2 * kStage) % kRing]; c != kNone) {
          __builtin_prefetch(&nodes_[nodes_[c].prev], 1);
          __builtin_prefetch(&nodes_[nodes_[c].next], 1);
        }
      }
      if (i >= 3 * kStage) {
        const size_t j = i - 3 * kStage;
        const uint64_t h = hashes[j % kRing];
        visit(j, Find(keys[j], h), h);
      }
    }
  }

  // REQUIRES: key is in no list.
  Node PushFront(ListId l, const BlockKey& key) { return PushFront(l, key, HashOf(key)); }
  // The same with the key's hash (HashOf) in hand.
  Node PushFront(ListId l, const BlockKey& key, uint64_t hash) {
    const Node n = Allocate(key);
    IndexInsert(static_cast<uint32_t>(hash >> 32), n);
    LinkFront(l, n);
    return n;
  }
  // Moves n, from whichever list holds it, to the front of l.
  void MoveToFront(ListId l, Node n) {
    Unlink(n);
    LinkFront(l, n);
  }
  // Places a key just behind `anchor` (one step less recent), in anchor's list: how a
  // policy keeps a request's blocks together, each deeper block behind the one before it.
  // REQUIRES: key is in no list; anchor is in a list.
  Node PushAfter(Node anchor, const BlockKey& key) { return PushAfter(anchor, key, HashOf(key)); }
  // The same with the key's hash (HashOf) in hand. anchor may also be a list's id (its
  // sentinel), which places the key at that list's front.
  Node PushAfter(Node anchor, const BlockKey& key, uint64_t hash) {
    const Node n = Allocate(key);
    IndexInsert(static_cast<uint32_t>(hash >> 32), n);
    LinkAfter(nodes_[anchor].list, anchor, n);
    return n;
  }
  // REQUIRES: n != anchor; anchor is in a list.
  void MoveAfter(Node anchor, Node n) {
    Unlink(n);
    LinkAfter(nodes_[anchor].list, anchor, n);
  }
  void Erase(Node n) {
    IndexErase(Tag(nodes_[n].key), n);
    Unlink(n);
    nodes_[n].next = free_;
    free_ = n;
  }

  // The least recent key of l for which is_pinned is false (a null is_pinned pins nothing);
  // kNone when there is none.
  Node LeastRecentUnpinned(ListId l, const EvictionPolicy::IsPinned& is_pinned) const {
    for (Node n = nodes_[l].prev; n != l; n = nodes_[n].prev) {
      if (!is_pinned || !is_pinned(nodes_[n].key)) return n;
    }
    return kNone;
  }
  void AppendLeastRecentFirst(ListId l, std::vector<BlockKey>& out) const {
    for (Node n = nodes_[l].prev; n != l; n = nodes_[n].prev) out.push_back(nodes_[n].key);
  }
  // Single-list policies' SelectVictim and EvictionOrder: the least recent unpinned key of l,
  // erased (nullopt when there is none), and l's keys least recent first.
  std::optional<BlockKey> PopLeastRecentUnpinned(ListId l,
                                                 const EvictionPolicy::IsPinned& is_pinned) {
    const Node n = LeastRecentUnpinned(l, is_pinned);
    if (n == kNone) return std::nullopt;
    const BlockKey key = nodes_[n].key;
    Erase(n);
    return key;
  }
  std::vector<BlockKey> LeastRecentFirst(ListId l) const {
    std::vector<BlockKey> out;
    AppendLeastRecentFirst(l, out);
    return out;
  }

 private:
  // 32 bytes, aligned to them so that no node straddles two cache lines.
  struct alignas(32) NodeData {
    BlockKey key;
    Node prev;
    Node next;  // also the free list's link
    ListId list;
    uint32_t stamp;
  };
  static_assert(sizeof(NodeData) == 32);
  // A slot keeps the high 32 bits of the key's hash beside the node, so that a probe passes
  // other keys without reading their nodes, and so that growing and erasing (which need each
  // entry's home slot) read no node either. The home is the tag's top bits; the bits below it
  // tell keys with the same home apart (ten of them at 2^22 slots: a false match, which costs
  // one node read, is rare).
  struct Slot {
    uint32_t tag;
    Node node;  // kNone: empty
  };
  static constexpr size_t kMinSlots = 16;
  // Index 64 MiB, slab 128 MiB of address space (touched only as keys arrive).
  static constexpr size_t kMaxReservedKeys = size_t{1} << 22;

  // At most half full: erasing (the backward shift) slows well before lookups do. Allowing 3/4
  // made evictions of `kvoffload-bench policy --policy=lru --blocks=1500000` (index 72% full)
  // take 160 ns against 90 ns.
  static bool FitsInTable(size_t keys, size_t slots) { return keys <= slots / 2; }
  static uint32_t Tag(const BlockKey& key) { return static_cast<uint32_t>(HashOf(key) >> 32); }
  size_t Home(uint32_t tag) const { return tag >> shift_; }

  // The node of the first slot on the hash's probe path with its tag (most likely the key's
  // own), or kNone; reads no node.
  Node Candidate(uint64_t hash) const {
    const auto tag = static_cast<uint32_t>(hash >> 32);
    for (size_t i = Home(tag);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.node == kNone || s.tag == tag) return s.node;
    }
  }

  Node Allocate(const BlockKey& key) {
    Node n = free_;
    if (n != kNone) {
      free_ = nodes_[n].next;
    } else {
      // kNone is the null index, so the slab holds one node less than a Node can address.
      if (nodes_.size() >= kNone) throw std::length_error("KeyLists: too many keys");
      n = static_cast<Node>(nodes_.size());
      nodes_.emplace_back();
    }
    nodes_[n].key = key;
    nodes_[n].stamp = 0;
    return n;
  }
  void LinkFront(ListId l, Node n) { LinkAfter(l, l, n); }
  // `after` is l's sentinel (the front) or a node of l.
  void LinkAfter(ListId l, Node after, Node n) {
    NodeData& d = nodes_[n];
    const Node next = nodes_[after].next;
    d.list = l;
    d.prev = after;
    d.next = next;
    nodes_[next].prev = n;
    nodes_[after].next = n;
    ++sizes_[l];
  }
  void Unlink(Node n) {
    const NodeData& d = nodes_[n];
    nodes_[d.prev].next = d.next;
    nodes_[d.next].prev = d.prev;
    --sizes_[d.list];
  }

  void IndexInsert(uint32_t tag, Node n) {
    if (!FitsInTable(count_ + 1, slots_.size())) ResizeTable(slots_.size() * 2);
    Place(tag, n);
    ++count_;
  }
  void Place(uint32_t tag, Node n) {
    size_t i = Home(tag);
    while (slots_[i].node != kNone) i = (i + 1) & mask_;
    slots_[i] = Slot{tag, n};
  }
  // Backward-shift deletion: later entries of the probe run move up into the hole, so that no
  // tombstones pile up under the constant insert/erase churn of a full cache.
  void IndexErase(uint32_t tag, Node n) {
    size_t hole = Home(tag);
    while (slots_[hole].node != n) hole = (hole + 1) & mask_;
    for (size_t j = (hole + 1) & mask_; slots_[j].node != kNone; j = (j + 1) & mask_) {
      // The entry at j may fill the hole only if the hole lies on its probe path (home .. j).
      if (((j - Home(slots_[j].tag)) & mask_) >= ((j - hole) & mask_)) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].node = kNone;
    --count_;
  }
  void ResizeTable(size_t slots) {
    // The home is taken from the top bits of a 32-bit tag.
    if (slots > (size_t{1} << 32)) throw std::length_error("KeyLists: too many keys");
    std::vector<Slot, HugePageAllocator<Slot>> old = std::move(slots_);
    slots_.assign(slots, Slot{0, kNone});
    mask_ = slots - 1;
    shift_ = 32 - std::countr_zero(slots);
    for (const Slot& s : old) {
      if (s.node != kNone) Place(s.tag, s.node);
    }
  }

  // kLists sentinels, then the keys' nodes.
  std::vector<NodeData, HugePageAllocator<NodeData>> nodes_;
  Node free_ = kNone;
  std::array<size_t, kLists> sizes_{};
  std::vector<Slot, HugePageAllocator<Slot>> slots_;
  size_t count_ = 0;  // occupied slots
  size_t mask_ = 0;
  int shift_ = 0;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_KEY_LIST_H_
