// Configuration from the webhook's environment: defaults, tiers JSON, and errors that name the
// variable and the value.
#include <gtest/gtest.h>

#include <map>

#include "kvoffload/config.h"
#include "kvoffload/eviction_policy.h"
#include "test_util.h"

namespace kvoffload {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

EngineConfig Base() { return testing::Config(1); }

TEST(ConfigTest, ReadsTheWebhookEnvironment) {
  Result<EngineConfig> c = ConfigFromEnv(
      Base(), FakeEnv({{"KVOFFLOAD_CPU_BYTES", "1048576"},
                       {"KVOFFLOAD_EVICTION_POLICY", "arc"},
                       {"KVOFFLOAD_TIERS",
                        R"([{"path":"/mnt/kv-cache-0","kind":"emptyDir","capacityBytes":1073741824,"persistent":false,"shared":false},
                            {"path":"/mnt/kv-cache-1","kind":"pvcRef","capacityBytes":2147483648,"persistent":true,"shared":true}])"}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cpu_bytes, 1048576u);
  EXPECT_EQ(c->eviction_policy, "arc");
  ASSERT_EQ(c->tiers.size(), 2u);
  EXPECT_EQ(c->tiers[0].path, "/mnt/kv-cache-0");
  EXPECT_EQ(c->tiers[0].capacity_bytes, 1073741824u);
  EXPECT_FALSE(c->tiers[0].persistent);
  EXPECT_EQ(c->tiers[1].kind, "pvcRef");
  EXPECT_TRUE(c->tiers[1].persistent);
  EXPECT_TRUE(c->tiers[1].shared);
}

TEST(ConfigTest, PolicyDefaultsToLruAndTiersToNone) {
  Result<EngineConfig> c = ConfigFromEnv(Base(), FakeEnv({{"KVOFFLOAD_CPU_BYTES", "65536"}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->eviction_policy, "lru");
  EXPECT_TRUE(c->tiers.empty());
}

// The environment accepts every registered policy, not a list of its own.
TEST(ConfigTest, AcceptsEveryRegisteredPolicy) {
  for (const std::string& name : EvictionPolicyNames()) {
    Result<EngineConfig> c = ConfigFromEnv(
        Base(), FakeEnv({{"KVOFFLOAD_CPU_BYTES", "65536"}, {"KVOFFLOAD_EVICTION_POLICY", name}}));
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    EXPECT_EQ(c->eviction_policy, name);
  }
  EXPECT_GE(EvictionPolicyNames().size(), 3u);
}

TEST(ConfigTest, PvcRefIsPersistentWhenTheFlagIsMissing) {
  Result<std::vector<DiskTierConfig>> t =
      ParseTiersJson(R"([{"path":"/mnt/kv-cache-0","kind":"pvcRef","capacityBytes":8192}])");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE((*t)[0].persistent);
}

struct BadCase {
  std::map<std::string, std::string> env;
  std::vector<std::string> must_mention;
};

TEST(ConfigTest, BadValuesNameTheVariableAndTheValue) {
  const std::vector<BadCase> cases = {
      {{}, {"KVOFFLOAD_CPU_BYTES", "not set"}},
      {{{"KVOFFLOAD_CPU_BYTES", "10Gi"}}, {"KVOFFLOAD_CPU_BYTES", "\"10Gi\""}},
      {{{"KVOFFLOAD_CPU_BYTES", "-5"}}, {"KVOFFLOAD_CPU_BYTES", "\"-5\""}},
      {{{"KVOFFLOAD_CPU_BYTES", "100"}}, {"KVOFFLOAD_CPU_BYTES=100"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"}, {"KVOFFLOAD_EVICTION_POLICY", "LRU"}},
       {"KVOFFLOAD_EVICTION_POLICY", "\"LRU\"",
        "use one of: arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"}, {"KVOFFLOAD_TIERS", "{oops"}},
       {"KVOFFLOAD_TIERS", "{oops", "not JSON"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"}, {"KVOFFLOAD_TIERS", R"({"path":"/x"})"}},
       {"KVOFFLOAD_TIERS", "array"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","capacityBytes":"1Gi"}])"}},
       {"KVOFFLOAD_TIERS[0].capacityBytes"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"hostPath","capacityBytes":1}])"}},
       {"KVOFFLOAD_TIERS[0].kind", "\"hostPath\""}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"relative","capacityBytes":4096}])"}},
       {"KVOFFLOAD_TIERS[0].path", "\"relative\""}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","capacityBytes":0}])"}},
       {"KVOFFLOAD_TIERS[0].capacityBytes"}},
  };
  for (const BadCase& bc : cases) {
    Result<EngineConfig> c = ConfigFromEnv(Base(), FakeEnv(bc.env));
    ASSERT_FALSE(c.ok()) << "accepted: " << (bc.env.empty() ? "(empty env)" : bc.env.begin()->second);
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    for (const std::string& m : bc.must_mention) {
      EXPECT_NE(c.status().message().find(m), std::string::npos)
          << "\"" << c.status().message() << "\" does not mention " << m;
    }
  }
}

TEST(ConfigTest, CallerFieldsAreValidated) {
  EngineConfig c = Base();
  c.fingerprint.model.clear();
  EXPECT_NE(c.Validate().message().find("fingerprint.model"), std::string::npos);
  c = Base();
  c.block_bytes = 0;
  EXPECT_FALSE(c.Validate().ok());
  c = Base();
  c.device = "tpu";
  EXPECT_NE(c.Validate().message().find("\"tpu\""), std::string::npos);
  c = Base();
  c.disk_io = "aio";
  EXPECT_NE(c.Validate().message().find("\"aio\""), std::string::npos);
  EXPECT_TRUE(Base().Validate().ok());
}

}  // namespace
}  // namespace kvoffload
