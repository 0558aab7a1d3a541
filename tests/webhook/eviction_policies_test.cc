// Which eviction policies each mode accepts: agent mode exactly the agent library's registry
// (through the header the build generates from it), vllm-native exactly vLLM's; the mode is
// known once the pod's annotation and the webhook's default are resolved, and the refusal names
// the field, the value, the mode and its list.
#include "webhook/eviction_policies.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvoffload/eviction_policy.h"
#include "webhook/mutator.h"
#include "webhook/spec.h"
#include "webhook/validation.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;
using Names = std::vector<std::string>;

Names Strings(std::span<const std::string_view> names) { return Names(names.begin(), names.end()); }

TEST(EvictionPoliciesTest, AgentListIsTheAgentRegistry) {
  EXPECT_EQ(Strings(EvictionPolicies(Mode::kAgent)), kvoffload::EvictionPolicyNames());
  EXPECT_EQ(Strings(EvictionPolicies(Mode::kAgent)),
            (Names{"arc", "chain-lru", "lirs", "lru", "lru-tinylfu", "s3fifo"}));
}

// vllm/v1/kv_offload/cpu/policies/factory.py of vLLM 0.32.0 registers these two.
TEST(EvictionPoliciesTest, VllmNativeListIsVllms) {
  EXPECT_EQ(Strings(EvictionPolicies(Mode::kVllmNative)), (Names{"arc", "lru"}));
}

// A pod of `config` checked as the pod webhook checks it, with `mode` as the webhook's default
// and, when set, `annotated_mode` as the pod's kvoffload.io/mode.
ObjectReport Check(const std::string& config, Mode mode, const std::string& annotated_mode = "") {
  json pod = json::parse(R"({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {"containers": [{"name": "main", "image": "vllm"}]}})");
  pod["metadata"]["annotations"][kAnnotationConfig] = config;
  if (!annotated_mode.empty()) pod["metadata"]["annotations"][kAnnotationMode] = annotated_mode;
  ValidationOptions options;
  options.default_mode = mode;
  options.agent_image = "kv-offload/agent:test";
  Result<ObjectReport> r = ValidateObject(pod, "team-a", options, nullptr);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r.ok() && r->checked);
  return r.ok() ? *r : ObjectReport{};
}

std::string Config(std::string_view policy) {
  return R"({"cpu":"1Gi","evictionPolicy":")" + std::string(policy) + R"("})";
}

TEST(EvictionPoliciesTest, EachModeAcceptsItsOwnList) {
  for (Mode mode : {Mode::kAgent, Mode::kVllmNative}) {
    for (std::string_view policy : EvictionPolicies(mode)) {
      const ObjectReport r = Check(Config(policy), mode);
      EXPECT_TRUE(r.errors.empty()) << ModeName(mode) << " " << policy << ": " << r.denial;
    }
  }
}

TEST(EvictionPoliciesTest, ChainLruIsAgentModeOnly) {
  EXPECT_TRUE(Check(Config("chain-lru"), Mode::kAgent).errors.empty());
  EXPECT_TRUE(Check(Config("chain-lru"), Mode::kVllmNative, "agent").errors.empty())
      << "the pod's annotation picks the mode";

  const ObjectReport r = Check(Config("chain-lru"), Mode::kVllmNative);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.denial,
            "kvCacheOffloading.evictionPolicy: \"chain-lru\" is not supported in vllm-native "
            "mode: use one of arc, lru (the policies vLLM 0.32.0 registers), or annotate the pod "
            "kvoffload.io/mode=agent (kvCacheOffloading from pod annotation kvoffload.io/config)");
  const ObjectReport annotated = Check(Config("chain-lru"), Mode::kAgent, "vllm-native");
  EXPECT_EQ(annotated.denial, r.denial);
}

// Names no mode accepts are refused by the spec parser, with every error of the spec, before
// the mode is known: both lists are named.
TEST(EvictionPoliciesTest, UnknownNameListsBothModes) {
  SpecParse parsed = ParseSpec(json::parse(R"({"cpu":"ten","evictionPolicy":"LRU"})"));
  ASSERT_EQ(parsed.errors.size(), 2u);
  EXPECT_EQ(parsed.errors[1].path, "kvCacheOffloading.evictionPolicy");
  EXPECT_EQ(
      parsed.errors[1].message,
      "\"LRU\" is not supported: use one of arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo (agent mode) "
      "or arc, lru (vllm-native mode); names are lowercase");
  EXPECT_TRUE(ParseSpec(json::parse(Config("chain-lru"))).errors.empty());
  EXPECT_FALSE(ParseSpec(json::parse(R"({"cpu":"1Gi","evictionPolicy":7})")).errors.empty());
}

}  // namespace
}  // namespace kvoffload::webhook
