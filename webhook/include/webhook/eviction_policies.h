// The eviction policies the webhook accepts in kvCacheOffloading.evictionPolicy, per mode.
// Agent mode: exactly the policies libkvoffload registers, from a header the build generates
// out of the agent's own registry. vllm-native mode: exactly the policies vLLM's
// CachePolicyFactory registers in the release the webhook targets. Immutable; thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_EVICTION_POLICIES_H_
#define KVOFFLOAD_WEBHOOK_EVICTION_POLICIES_H_

#include <span>
#include <string>
#include <string_view>

namespace kvoffload::webhook {

enum class Mode;  // webhook/mutator.h

// The vLLM release whose policies vllm-native mode accepts (hack/vllm-venv.sh pins the same).
inline constexpr std::string_view kTargetVllmVersion = "0.32.0";

// Sorted.
std::span<const std::string_view> EvictionPolicies(Mode mode);

// The spec parser's check, made before the mode is known: whether some mode accepts `name`,
// and the message (after the field path) for a value none accepts, listing both modes' names.
bool IsEvictionPolicyOfSomeMode(std::string_view name);
std::string NoModeAcceptsEvictionPolicy(std::string_view quoted_value);

// The check once the pod's mode is resolved: "" when `mode` accepts `policy` (or it is unset,
// the default lru being in every list), else the message (after the field path) naming the
// value, the mode, its list and the other mode.
std::string EvictionPolicyModeError(std::string_view policy, Mode mode);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_EVICTION_POLICIES_H_
