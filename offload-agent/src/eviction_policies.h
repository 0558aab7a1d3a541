// The eviction policy registry (registry.h) and the built-in policies' factories, one file each.
// Not public: callers pick a policy by name (NewEvictionPolicy).
#ifndef KVOFFLOAD_SRC_EVICTION_POLICIES_H_
#define KVOFFLOAD_SRC_EVICTION_POLICIES_H_

#include <cstddef>
#include <memory>

#include "kvoffload/eviction_policy.h"
#include "registry.h"

namespace kvoffload {

// Factories take the tier's capacity in blocks (> 0).
using EvictionPolicyRegistry = Registry<EvictionPolicy, size_t>;
// Built on first use with every built-in registered (registry.h says why); never destroyed.
EvictionPolicyRegistry& EvictionPolicies();

std::unique_ptr<EvictionPolicy> NewLruPolicy(size_t capacity_blocks);
std::unique_ptr<EvictionPolicy> NewArcPolicy(size_t capacity_blocks);
std::unique_ptr<EvictionPolicy> NewChainLruPolicy(size_t capacity_blocks);
std::unique_ptr<EvictionPolicy> NewS3FifoPolicy(size_t capacity_blocks);
std::unique_ptr<EvictionPolicy> NewLruTinyLfuPolicy(size_t capacity_blocks);
std::unique_ptr<EvictionPolicy> NewLirsPolicy(size_t capacity_blocks);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_EVICTION_POLICIES_H_
