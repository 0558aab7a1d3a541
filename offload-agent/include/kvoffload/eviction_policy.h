// Eviction policies: which resident block a tier gives up when it needs room.
// A policy only orders keys; the tier owns the data and says which keys are pinned.
// Not thread-safe: the owning tier calls it under its own lock.
//
// What the engine knows reaches the policy through this interface, so that a policy that uses
// it (a KV-aware one) is one new file:
//   - the order of a request's blocks: OnInsertAt / OnAccessAt carry the block's position in
//     the prefix chain of the call that stores or loads it (0 = its first block). A KV block
//     is only usable behind every block before it, so evicting a chain's head first wastes
//     the rest of the chain, and plain recency does exactly that (a request reads its head
//     first, so the head is always the least recent of its blocks);
//   - holds: OnHold when a lookup reports a block and holds it for a load that should follow,
//     OnRelease when the hold ends; is_pinned reports a held block as pinned meanwhile;
//   - load after lookup: a load of a held block is OnAccessAt, after its OnHold (the pinned
//     tier hands a load's blocks over together, OnAccessBatch, which defaults to OnAccessAt
//     for each in order).
// The defaults forward the positioned calls to OnInsert / OnAccess and ignore holds, so a
// policy that needs none of it (lru, arc) implements only the pure virtual methods.
#ifndef KVOFFLOAD_EVICTION_POLICY_H_
#define KVOFFLOAD_EVICTION_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/block_key.h"
#include "kvoffload/export.h"
#include "kvoffload/status.h"

namespace kvoffload {

class KVOFFLOAD_EXPORT EvictionPolicy {
 public:
  // True when the key may not be evicted now (a copy or disk read is using it).
  using IsPinned = std::function<bool(const BlockKey&)>;

  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;

  // A block is becoming resident. Called before the tier makes room, so that policies which
  // adapt on history (ARC) adapt before they choose the victim; the tier keeps the new key
  // pinned until its data is in place. REQUIRES: key not resident.
  virtual void OnInsert(const BlockKey& key) = 0;
  // A resident block was used (a load). REQUIRES: key resident.
  virtual void OnAccess(const BlockKey& key) = 0;
  // A resident block left for a reason other than eviction (corrupt file, removed by another
  // process). No history is kept for it. A key that is not resident is ignored.
  virtual void OnRemove(const BlockKey& key) = 0;
  // Chooses a resident, unpinned block to evict and forgets it as resident (policies with
  // history remember it). nullopt when every resident block is pinned or none is resident.
  virtual std::optional<BlockKey> SelectVictim(const IsPinned& is_pinned) = 0;

  // Engine knowledge (see the top of this file); the defaults ignore what they add.
  static constexpr uint32_t kUnknownPosition = UINT32_MAX;
  // OnInsert for a block at `position` of the chain the tier is storing, in chain order (a
  // store skips the blocks its chain has already, so positions may leave gaps). Position 0
  // starts a chain; calls of several jobs interleave, so a later position may belong to
  // another chain than the latest call's, and one no further than the latest call's does.
  virtual void OnInsertAt(const BlockKey& key, uint32_t position);
  // OnAccess for a block at `position` of the chain the tier is loading, in chain order.
  virtual void OnAccessAt(const BlockKey& key, uint32_t position);
  // OnAccessAt(keys[i], positions[i]) for each i in order: a load's resident blocks at once,
  // so that a policy can overlap their lookups' cache misses (at a million blocks each is a
  // chain of misses). REQUIRES: keys.size() == positions.size(); each key resident.
  virtual void OnAccessBatch(std::span<const BlockKey> keys, std::span<const uint32_t> positions);
  // A lookup reported the resident block and holds it for a load (is_pinned says so until the
  // hold ends); OnRelease when it ends, loaded or not. A key not resident is ignored.
  virtual void OnHold(const BlockKey& key);
  virtual void OnRelease(const BlockKey& key);

  virtual size_t resident() const = 0;
  // Resident keys, next victim first; for tests and debugging.
  virtual std::vector<BlockKey> EvictionOrder() const = 0;
  // Internal state in one line ("arc p=2 t1=3 t2=1 b1=0 b2=2"); for tests and logs.
  virtual std::string DebugString() const = 0;
};

// The most blocks one tier's policy indexes, whichever policy: s3fifo keeps up to twice its
// live blocks in rings of 2^31 positions, the others 32-bit indexes. A disk tier holds no more
// blocks than this (DiskTier::Open lowers its capacity to it); 2^29 blocks of the smallest
// (4 KiB) are 2 TiB, of a 7B model's (2 MiB at 16 tokens) 1 PiB.
inline constexpr size_t kMaxEvictionPolicyBlocks = size_t{1} << 29;

// Builds a policy for a tier holding at most capacity_blocks blocks (one of
// EvictionPolicyNames()). Unknown names are InvalidArgument listing the registered ones, a
// capacity of 0 or past kMaxEvictionPolicyBlocks InvalidArgument naming it.
KVOFFLOAD_EXPORT Result<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(std::string_view name,
                                                          size_t capacity_blocks);

// The registered policies, sorted: the built-ins ("arc", "chain-lru", "lirs", "lru",
// "lru-tinylfu", "s3fifo") and any added with RegisterEvictionPolicy. The agent's configuration, the C API
// (kvo_policy_names) and, through a header generated at build time, the webhook all take their
// list from here.
KVOFFLOAD_EXPORT std::vector<std::string> EvictionPolicyNames();

// Adds a policy at run time (tests, embedders); built-in policies are listed in
// eviction_policy.cc instead. False when the name is taken or is not lowercase letters,
// digits and '-'.
using EvictionPolicyFactory = std::unique_ptr<EvictionPolicy> (*)(size_t capacity_blocks);
KVOFFLOAD_EXPORT bool RegisterEvictionPolicy(std::string_view name, EvictionPolicyFactory factory);

}  // namespace kvoffload

#endif  // KVOFFLOAD_EVICTION_POLICY_H_
