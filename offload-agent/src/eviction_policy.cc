// The eviction policy registry with its built-ins, and the defaults of the optional calls.
#include "eviction_policies.h"

namespace kvoffload {

EvictionPolicyRegistry& EvictionPolicies() {
  // Leaked on purpose: policies may be created from other objects' destructors at exit.
  static EvictionPolicyRegistry* registry = [] {
    auto* r = new EvictionPolicyRegistry("eviction policy");
    // The built-ins; a new policy file adds its line here (registry.h says why not itself).
    r->Register("lru", &NewLruPolicy);
    r->Register("arc", &NewArcPolicy);
    r->Register("chain-lru", &NewChainLruPolicy);
    r->Register("s3fifo", &NewS3FifoPolicy);
    r->Register("lru-tinylfu", &NewLruTinyLfuPolicy);
    r->Register("lirs", &NewLirsPolicy);
    return r;
  }();
  return *registry;
}

void EvictionPolicy::OnInsertAt(const BlockKey& key, uint32_t /*position*/) { OnInsert(key); }
void EvictionPolicy::OnAccessAt(const BlockKey& key, uint32_t /*position*/) { OnAccess(key); }
void EvictionPolicy::OnAccessBatch(std::span<const BlockKey> keys,
                                   std::span<const uint32_t> positions) {
  for (size_t i = 0; i < keys.size(); ++i) OnAccessAt(keys[i], positions[i]);
}
void EvictionPolicy::OnHold(const BlockKey& /*key*/) {}
void EvictionPolicy::OnRelease(const BlockKey& /*key*/) {}

bool RegisterEvictionPolicy(std::string_view name, EvictionPolicyFactory factory) {
  if (factory == nullptr) return false;
  return EvictionPolicies().Register(
      name, [factory](size_t capacity) -> Result<std::unique_ptr<EvictionPolicy>> {
        return factory(capacity);
      });
}

std::vector<std::string> EvictionPolicyNames() { return EvictionPolicies().Names(); }

Result<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(std::string_view name,
                                                          size_t capacity_blocks) {
  if (!EvictionPolicies().Contains(name)) return EvictionPolicies().Unknown(name);
  if (capacity_blocks == 0) {
    return Status::InvalidArgument("eviction policy \"" + std::string(name) +
                                   "\": capacity must hold at least one block");
  }
  if (capacity_blocks > kMaxEvictionPolicyBlocks) {
    // Past it a policy's index ran out in the middle of a store (s3fifo threw from a store
    // thread, which ended the process); refused where the tier is made instead.
    return Status::InvalidArgument(
        "eviction policy \"" + std::string(name) + "\": a tier of " +
        std::to_string(capacity_blocks) + " blocks is more than a policy indexes (" +
        std::to_string(kMaxEvictionPolicyBlocks) + "); give the tier a smaller capacity or "
        "larger blocks");
  }
  return EvictionPolicies().Create(name, capacity_blocks);
}

}  // namespace kvoffload
