// Eviction policies: which resident block a tier gives up when it needs room.
// A policy only orders keys; the tier owns the data and says which keys are pinned.
// Not thread-safe: the owning tier calls it under its own lock.
#ifndef KVOFFLOAD_EVICTION_POLICY_H_
#define KVOFFLOAD_EVICTION_POLICY_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
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

  virtual size_t resident() const = 0;
  // Resident keys, next victim first; for tests and debugging.
  virtual std::vector<BlockKey> EvictionOrder() const = 0;
  // Internal state in one line ("arc p=2 t1=3 t2=1 b1=0 b2=2"); for tests and logs.
  virtual std::string DebugString() const = 0;
};

// Builds a policy for a tier holding at most capacity_blocks blocks ("lru", "arc").
// Unknown names are InvalidArgument listing the known ones.
KVOFFLOAD_EXPORT Result<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(std::string_view name,
                                                          size_t capacity_blocks);

// Registration, so that a new policy is one new file: define a factory there and register it
// with a namespace-scope `const bool kRegistered = RegisterEvictionPolicy("name", &Factory);`.
using EvictionPolicyFactory = std::unique_ptr<EvictionPolicy> (*)(size_t capacity_blocks);
KVOFFLOAD_EXPORT bool RegisterEvictionPolicy(std::string_view name, EvictionPolicyFactory factory);
KVOFFLOAD_EXPORT std::vector<std::string> EvictionPolicyNames();

}  // namespace kvoffload

#endif  // KVOFFLOAD_EVICTION_POLICY_H_
