// Configuration from the webhook's environment: defaults, tiers JSON, and errors that name the
// variable and the value.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
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

// An empty variable is an unset one, as the Python adapter reads it (settings.py): the same
// pod env means the same engine from either side.
TEST(ConfigTest, AnEmptyVariableIsAnUnsetOne) {
  Result<EngineConfig> c = ConfigFromEnv(
      Base(), FakeEnv({{"KVOFFLOAD_CPU_BYTES", "65536"},
                       {"KVOFFLOAD_EVICTION_POLICY", ""},
                       {"KVOFFLOAD_TIERS", ""}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->eviction_policy, "lru");
  EXPECT_TRUE(c->tiers.empty());
  c = ConfigFromEnv(Base(), FakeEnv({{"KVOFFLOAD_CPU_BYTES", ""}}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "KVOFFLOAD_CPU_BYTES is not set (or empty); the webhook sets "
                                  "it from kvCacheOffloading.cpu");
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

// capacityBytes 0 is what the webhook writes for a pvc.ref it could not read: the tier takes
// its file system's size less the webhook's headroom, min(size/2, 8 MiB + size/64).
TEST(ConfigTest, ZeroCapacityIsTheFileSystemsSizeLessTheHeadroom) {
  testing::TempDir dir;
  const bool mounted = ::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=64m") == 0;
  KVO_REQUIRE_CAPABILITY("a 64 MiB tmpfs mounted (root)", mounted ? "" : std::strerror(errno));
  Result<std::vector<DiskTierConfig>> t = ParseTiersJson(
      R"([{"path":")" + dir.path() + R"(","kind":"pvcRef","capacityBytes":0},
          {"path":"/mnt/kv-cache-1","kind":"pvcRef","capacityBytes":8192}])");
  ::umount2(dir.path().c_str(), MNT_DETACH);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)[0].capacity_bytes, uint64_t{64 - 8 - 1} << 20);
  EXPECT_EQ((*t)[1].capacity_bytes, 8192u);  // a known size is taken as it is

  Result<std::vector<DiskTierConfig>> missing = ParseTiersJson(
      R"([{"path":"/nonexistent/kv-cache-0","kind":"pvcRef","capacityBytes":0}])");
  ASSERT_FALSE(missing.ok());
  for (const char* m : {"KVOFFLOAD_TIERS[0].capacityBytes=0", "/nonexistent/kv-cache-0",
                        "No such file or directory"}) {
    EXPECT_NE(missing.status().message().find(m), std::string::npos)
        << missing.status().message() << " does not mention " << m;
  }
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
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"emptyDir","capacityBytes":"1Gi"}])"}},
       {"KVOFFLOAD_TIERS[0].capacityBytes"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"hostPath","capacityBytes":1}])"}},
       {"KVOFFLOAD_TIERS[0].kind", "\"hostPath\""}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"relative","kind":"emptyDir","capacityBytes":4096}])"}},
       {"KVOFFLOAD_TIERS[0].path", "\"relative\""}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"emptyDir","capacityBytes":0}])"}},
       {"KVOFFLOAD_TIERS[0].capacityBytes"}},
      // Both parsers (here and the Python adapter's) refuse a missing kind and a size as text.
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","capacityBytes":65536}])"}},
       {"KVOFFLOAD_TIERS[0].kind must be a string"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"emptyDir","capacityBytes":"65536"}])"}},
       {"KVOFFLOAD_TIERS[0].capacityBytes=\"65536\"", "must be a non-negative integer"}},
      // A misspelt flag is not read as absent: the tier would start empty on every restart.
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"emptyDir","capacityBytes":4096,"persistant":true}])"}},
       {"KVOFFLOAD_TIERS[0]", "unknown key \"persistant\"", "persistent"}},
      // One directory written two ways is still one directory.
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/mnt/a","kind":"emptyDir","capacityBytes":4096},
                                {"path":"/mnt/b","kind":"emptyDir","capacityBytes":4096},
                                {"path":"/mnt/b/../a/","kind":"emptyDir","capacityBytes":4096}])"}},
       {"KVOFFLOAD_TIERS[2].path=\"/mnt/b/../a/\"", "tier 0's directory", "\"/mnt/a\""}},
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

// Found by running the library with inputs a hand-written setup could give it.
TEST(ConfigTest, WhatJsonLetsThroughIsRefusedToo) {
  const std::string tier = R"("kind":"pvcRef","capacityBytes":4096)";
  std::string twenty = "[";
  for (int i = 0; i < 20; ++i) {
    twenty += std::string(i ? "," : "") + R"({"path":"/mnt/t)" + std::to_string(i) + "\"," + tier + "}";
  }
  twenty += "]";
  const std::vector<BadCase> cases = {
      // Duplicate keys: JSON parsers keep the last; "persistent":false after true made a pvcRef
      // tier start empty, removing what it held.
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x",)" + tier + R"(},{"path":"/y",)" + tier +
                                R"(,"persistent":true,"persistent":false}])"}},
       {"KVOFFLOAD_TIERS[1]", "\"persistent\" twice", "give each key once"}},
      // Past KVO_MAX_TIERS the tiers ran, but stats and metrics dropped them.
      {{{"KVOFFLOAD_CPU_BYTES", "65536"}, {"KVOFFLOAD_TIERS", twenty}},
       {"KVOFFLOAD_TIERS", "20 disk tiers", "at most 15"}},
      // A NUL cut the message where it stood (returned through c_str()).
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"emptyDir\u0000x","capacityBytes":4096}])"}},
       {"KVOFFLOAD_TIERS[0].kind=\"emptyDir\\u0000x\""}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x/\u0001y","kind":"emptyDir","capacityBytes":4096}])"}},
       {"KVOFFLOAD_TIERS[0].path=\"/x/\\u0001y\"", "control character"}},
      // An integer out of range is no "not an integer"; the value is quoted, not the document.
      {{{"KVOFFLOAD_CPU_BYTES", "18446744073709551616"}},
       {"KVOFFLOAD_CPU_BYTES=\"18446744073709551616\"", "more than 2^64-1"}},
      {{{"KVOFFLOAD_CPU_BYTES", "65536"},
        {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"emptyDir","capacityBytes":18446744073709551616}])"}},
       {"KVOFFLOAD_TIERS[0].capacityBytes=", "at most 2^64-1"}},
  };
  for (const BadCase& bc : cases) {
    Result<EngineConfig> c = ConfigFromEnv(Base(), FakeEnv(bc.env));
    ASSERT_FALSE(c.ok()) << "accepted: " << bc.env.rbegin()->second;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message().find('\0'), std::string::npos);
    for (const std::string& m : bc.must_mention) {
      EXPECT_NE(c.status().message().find(m), std::string::npos)
          << "\"" << c.status().message() << "\" does not mention " << m;
    }
  }
  // The value, not the whole document: with many tiers the message was kilobytes.
  Result<EngineConfig> big = ConfigFromEnv(
      Base(), FakeEnv({{"KVOFFLOAD_CPU_BYTES", "65536"},
                       {"KVOFFLOAD_TIERS", R"([{"path":"/x","kind":"emptyDir","capacityBytes":-1}])"}}));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message().find("KVOFFLOAD_TIERS=["), std::string::npos) << big.status().message();
}

// A misspelt variable read as absent ran without disk tiers or with lru, and nothing said so
// (the adapter refuses near misses; the C API's from_env path did not).
TEST(ConfigTest, ANearMissOfOurVariablesIsRefused) {
  for (const char* name : {"KVOFFLOAD_TIER=[]", "kvoffload_tiers=[]", "KVOFFLOAD_CPU_BYTE=1",
                           "KVOFFLOAD_EVICTION_POLICIES=arc", "KVOFFLOAD_CPUBYTES=1"}) {
    const char* env[] = {"PATH=/bin", name, nullptr};
    const Status s = RefuseMisspeltVariables(env);
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_NE(s.message().find(" is set, but no such variable is read; did you mean KVOFFLOAD_"),
              std::string::npos)
        << s.message();
  }
  const char* fine[] = {"KVOFFLOAD_CPU_BYTES=1",      "KVOFFLOAD_EVICTION_POLICY=lru",
                        "KVOFFLOAD_TIERS=[]",         "KVOFFLOAD_LIBRARY=/x.so",
                        "KVOFFLOAD_CONFIG_HASH=abc",  "KVOFFLOAD_VLLM_PYTHON=0.34.0",
                        "KVOFFLOAD_CACHE=/var/cache", "HOME=/root",
                        nullptr};
  EXPECT_TRUE(RefuseMisspeltVariables(fine).ok()) << RefuseMisspeltVariables(fine).message();
}

// Names that differ can still be one directory: a symbolic link, or two mounts of one volume
// (a claim's directory mounted for two tiers). Below a directory that exists, the names still to
// be created (a rank's directory) are compared too.
TEST(ConfigTest, OneDirectoryUnderTwoNamesIsRefused) {
  testing::TempDir dir;
  const std::string real = dir.path() + "/real", link = dir.path() + "/link";
  ASSERT_TRUE(std::filesystem::create_directory(real));
  std::filesystem::create_directory_symlink(real, link);
  auto tiers = [](const std::string& a, const std::string& b) {
    EngineConfig c = Base();
    c.tiers = {testing::Tier(a, 1), testing::Tier(b, 1)};
    return c.Validate();
  };
  for (const std::string& sub : {std::string(), std::string("/rank0")}) {
    const Status s = tiers(real + sub, link + sub);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << sub;
    EXPECT_NE(s.message().find("KVOFFLOAD_TIERS[1].path=\"" + link + sub + "\" is tier 0's "
                               "directory too (\"" + real + sub + "\", through a link or a "
                               "second mount)"),
              std::string::npos)
        << s.message();
  }
  EXPECT_TRUE(tiers(real + "/rank0", link + "/rank1").ok());
  EXPECT_TRUE(tiers(real + "/a/rank0", real + "/b/rank0").ok());
  EXPECT_TRUE(tiers(real, dir.path()).ok());
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
