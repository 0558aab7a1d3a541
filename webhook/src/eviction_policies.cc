#include "webhook/eviction_policies.h"

#include <algorithm>
#include <array>

#include "webhook/agent_eviction_policies.h"  // generated from libkvoffload's registry
#include "webhook/mutator.h"

namespace kvoffload::webhook {
namespace {

// vLLM 0.32.0 registers these two in vllm/v1/kv_offload/cpu/policies/factory.py
// (CachePolicyFactory); TieringOffloadingSpec looks eviction_policy up there. A newer vLLM
// that registers more is a change here and to kTargetVllmVersion.
constexpr std::array<std::string_view, 2> kVllmNativePolicies = {"arc", "lru"};

bool Contains(std::span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string Joined(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace

std::span<const std::string_view> EvictionPolicies(Mode mode) {
  if (mode == Mode::kAgent) return generated::kAgentEvictionPolicies;
  return kVllmNativePolicies;
}

bool IsEvictionPolicyOfSomeMode(std::string_view name) {
  return Contains(EvictionPolicies(Mode::kAgent), name) ||
         Contains(EvictionPolicies(Mode::kVllmNative), name);
}

std::string NoModeAcceptsEvictionPolicy(std::string_view quoted_value) {
  return std::string(quoted_value) + " is not supported: use one of " +
         Joined(EvictionPolicies(Mode::kAgent)) + " (agent mode) or " +
         Joined(EvictionPolicies(Mode::kVllmNative)) +
         " (vllm-native mode); names are lowercase";
}

std::string EvictionPolicyModeError(std::string_view policy, Mode mode) {
  if (policy.empty() || Contains(EvictionPolicies(mode), policy)) return "";
  const Mode other = mode == Mode::kAgent ? Mode::kVllmNative : Mode::kAgent;
  const std::string whose = mode == Mode::kAgent
                                ? "the policies of the kv-offload agent"
                                : "the policies vLLM " + std::string(kTargetVllmVersion) +
                                      " registers";
  std::string message = "\"" + std::string(policy) + "\" is not supported in " + ModeName(mode) +
                        " mode: use one of " + Joined(EvictionPolicies(mode)) + " (" + whose +
                        ")";
  if (Contains(EvictionPolicies(other), policy)) {
    message += ", or annotate the pod " + std::string(kAnnotationMode) + "=" + ModeName(other);
  }
  return message;
}

}  // namespace kvoffload::webhook
