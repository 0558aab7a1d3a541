#include "webhook/spec.h"

#include <gtest/gtest.h>

#include <string>

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

struct ErrorCase {
  const char* spec;     // JSON
  const char* path;     // expected field path of the first error
  const char* message;  // expected message (substring)
};

class SpecErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(SpecErrorTest, ReportsFieldPathAndMessage) {
  const ErrorCase& c = GetParam();
  SpecParse parsed = ParseSpec(json::parse(c.spec));
  ASSERT_FALSE(parsed.errors.empty()) << c.spec;
  bool found = false;
  for (const FieldError& e : parsed.errors) {
    found = found || (e.path == c.path && e.message.find(c.message) != std::string::npos);
  }
  std::string all = FormatSpecErrors(parsed.errors, SpecSource::PodAnnotation());
  EXPECT_TRUE(found) << "want " << c.path << ": " << c.message << "\ngot " << all;
  // Every denial names the spec's source.
  EXPECT_NE(all.find("pod annotation kvoffload.io/config"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    DesignMessages, SpecErrorTest,
    ::testing::Values(
        ErrorCase{R"({"secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"}}}]})",
                  "kvCacheOffloading.cpu", "cpu must be set when secondary tiers are configured"},
        ErrorCase{R"({})", "kvCacheOffloading.cpu", "cpu is required"},
        ErrorCase{R"({"cpu":"ten"})", "kvCacheOffloading.cpu", "\"ten\" is not a valid quantity"},
        ErrorCase{R"({"cpu":"0"})", "kvCacheOffloading.cpu", "must be greater than 0"},
        ErrorCase{R"({"cpu":"-1Gi"})", "kvCacheOffloading.cpu", "must be greater than 0"},
        ErrorCase{R"({"cpu":true})", "kvCacheOffloading.cpu", "must be a quantity string"},
        ErrorCase{R"({"cpu":"1Gi","evictionPolicy":"LRU"})", "kvCacheOffloading.evictionPolicy",
                  "\"LRU\" is not supported: use one of arc, chain-lru, lirs, lru, "
                  "lru-tinylfu, s3fifo (agent mode) or arc, lru (vllm-native mode)"},
        ErrorCase{R"({"cpu":"1Gi","evictionPolicy":"lfu"})", "kvCacheOffloading.evictionPolicy",
                  "is not supported"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{}]})", "kvCacheOffloading.secondary[0].fileSystem",
                  "only fileSystem tiers are supported; fileSystem must be set"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem",
                  "exactly one of emptyDir or pvc must be set"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"},"pvc":{"ref":{"name":"a"}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem",
                  "exactly one of emptyDir or pvc must be set; multiple are set"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc",
                  "exactly one of spec or ref must be set"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"spec":{},"ref":{"name":"a"}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc",
                  "exactly one of spec or ref must be set; multiple are set"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"path":"x"}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc.ref.name", "name is required"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"100Gx"}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.emptyDir.size",
                  "\"100Gx\" is not a valid quantity"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"0"}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.emptyDir.size",
                  "must be greater than 0"},
        // Milli for mega: a fraction of a byte was taken as it stood (a 1-byte tier).
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"100m"}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.emptyDir.size",
                  "\"100m\" is not a whole number of bytes (m is milli, a thousandth); for "
                  "megabytes write \"100M\" or \"100Mi\""},
        ErrorCase{R"({"cpu":"10m"})", "kvCacheOffloading.cpu",
                  "\"10m\" is not a whole number of bytes"},
        ErrorCase{R"({"cpu":"0.5"})", "kvCacheOffloading.cpu",
                  "\"0.5\" is not a whole number of bytes"},
        // The API server refuses such a claim, in words about the pod's volume we added.
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc.spec.accessModes",
                  "at least one access mode is required"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.emptyDir.size", "size is required"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"}}},{"fileSystem":{"pvc":{"ref":{"name":"My_PVC"}}}}]})",
                  "kvCacheOffloading.secondary[1].fileSystem.pvc.ref.name",
                  "is not a valid PVC name"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"a","path":"/abs"}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc.ref.path",
                  "must be relative to the volume root"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"a","path":"a/../../b"}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc.ref.path",
                  "must not contain a '..' segment"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"a","path":".."}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc.ref.path",
                  "must not contain a '..' segment"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"a","path":"a\u0000b"}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc.ref.path",
                  "must not contain control characters"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"spec":{"accessModes":["ReadWriteOnce"]}}}}]})",
                  "kvCacheOffloading.secondary[0].fileSystem.pvc.spec.resources.requests.storage",
                  "storage is required"},
        ErrorCase{R"({"cpu":"1Gi","evictionPolicty":"arc"})", "kvCacheOffloading.evictionPolicty",
                  "unknown field"},
        ErrorCase{R"({"cpu":"1Gi","secondary":{"fileSystem":{}}})", "kvCacheOffloading.secondary",
                  "must be a list of tiers"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv","path":"a"}}}},{"fileSystem":{"pvc":{"ref":{"name":"kv","path":"a"}}}}]})",
                  "kvCacheOffloading.secondary[1].fileSystem.pvc.ref.path",
                  "\"a\" of claim kv is kvCacheOffloading.secondary[0]'s directory too; two "
                  "tiers cannot share one: give each its own path (e.g. \"kv-cache-0/\" and "
                  "\"kv-cache-1/\")"},
        // One directory, spelt another way, after a tier of another kind.
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv","path":"./a//b/"}}}},{"fileSystem":{"emptyDir":{"size":"1Gi"}}},{"fileSystem":{"pvc":{"ref":{"name":"kv","path":"a/b"}}}}]})",
                  "kvCacheOffloading.secondary[2].fileSystem.pvc.ref.path",
                  "is kvCacheOffloading.secondary[0]'s directory too"},
        ErrorCase{R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv"}}}},{"fileSystem":{"pvc":{"ref":{"name":"kv","path":"."}}}}]})",
                  "kvCacheOffloading.secondary[1].fileSystem.pvc.ref.path",
                  "the root of claim kv is kvCacheOffloading.secondary[0]'s directory too"},
        ErrorCase{R"("10Gi")", "kvCacheOffloading", "must be an object"}));

// Tiers of one claim in directories of their own, or of two claims at one path, are fine.
TEST(SpecTest, TiersOfOneClaimInTheirOwnDirectoriesAreValid) {
  SpecParse parsed = ParseSpec(json::parse(R"({"cpu": "1Gi", "secondary": [
      {"fileSystem": {"pvc": {"ref": {"name": "kv", "path": "a"}}}},
      {"fileSystem": {"pvc": {"ref": {"name": "kv", "path": "a/b"}}}},
      {"fileSystem": {"pvc": {"ref": {"name": "other", "path": "a"}}}},
      {"fileSystem": {"pvc": {"ref": {"name": "kv"}}}}]})"));
  EXPECT_TRUE(parsed.errors.empty()) << FormatSpecErrors(parsed.errors, SpecSource::PodAnnotation());
  EXPECT_EQ(parsed.spec.secondary.size(), 4u);
}

TEST(SpecTest, ValidSpecIsNormalised) {
  SpecParse parsed = ParseSpec(json::parse(R"({
    "cpu": "10240Mi", "evictionPolicy": "arc",
    "secondary": [
      {"fileSystem": {"emptyDir": {"size": "100Gi"}}},
      {"fileSystem": {"pvc": {"spec": {"accessModes": ["ReadWriteOnce"],
                                       "resources": {"requests": {"storage": "200Gi"}}}}}},
      {"fileSystem": {"pvc": {"ref": {"name": "my-kv-cache-pvc", "path": "kv-cache/"}}}}]})"));
  ASSERT_TRUE(parsed.errors.empty()) << parsed.errors[0].message;
  const OffloadSpec& s = parsed.spec;
  EXPECT_EQ(s.cpu.Value(), 10LL << 30);
  EXPECT_EQ(s.eviction_policy, "arc");
  ASSERT_EQ(s.secondary.size(), 3u);
  EXPECT_EQ(s.secondary[0].kind, TierKind::kEmptyDir);
  EXPECT_EQ(s.secondary[1].kind, TierKind::kPvcSpec);
  EXPECT_EQ(s.secondary[1].size.Value(), 200LL << 30);
  EXPECT_EQ(s.secondary[2].ref_name, "my-kv-cache-pvc");
  EXPECT_EQ(s.secondary[2].ref_path, "kv-cache/");
  // Same meaning, different spelling: same canonical form (and so the same config hash).
  EXPECT_EQ(s.Canonical()["cpu"], "10Gi");
}

TEST(SpecTest, AnnotationTextErrorsNameTheSource) {
  Result<OffloadSpec> bad = ParseSpecText("{cpu: 10Gi}", SpecSource::PodAnnotation());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pod annotation kvoffload.io/config is not valid JSON"),
            std::string::npos)
      << bad.status().message();
  Result<OffloadSpec> deep =
      ParseSpecText(std::string(10000, '[') + std::string(10000, ']'), SpecSource::NamespaceDefault("a"));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nests deeper than"), std::string::npos);
}

// Each thread keeps its last answer: the same text from another source, or another text, must
// each get their own.
TEST(SpecTest, RepeatedTextsGetTheirOwnSourceAndSpec) {
  const std::string bad = R"({"cpu": "lots"})";
  for (int round = 0; round < 2; ++round) {
    Result<OffloadSpec> a = ParseSpecText(bad, SpecSource::PodAnnotation());
    Result<OffloadSpec> b = ParseSpecText(bad, SpecSource::NamespaceDefault("team-b"));
    ASSERT_FALSE(a.ok());
    ASSERT_FALSE(b.ok());
    EXPECT_NE(a.status().message().find("from pod annotation"), std::string::npos)
        << a.status().message();
    EXPECT_NE(b.status().message().find("from namespace team-b"), std::string::npos)
        << b.status().message();
    for (const char* cpu : {"1Gi", "2Gi", "2Gi"}) {
      Result<OffloadSpec> ok =
          ParseSpecText(json{{"cpu", cpu}}.dump(), SpecSource::PodAnnotation());
      ASSERT_TRUE(ok.ok()) << ok.status().message();
      EXPECT_EQ(ok->cpu.ToString(), cpu);
    }
  }
}

TEST(SpecTest, Dns1123Subdomain) {
  EXPECT_TRUE(IsDns1123Subdomain("my-kv-cache-pvc"));
  EXPECT_TRUE(IsDns1123Subdomain("a.b-c.d"));
  EXPECT_FALSE(IsDns1123Subdomain("-a"));
  EXPECT_FALSE(IsDns1123Subdomain("a-"));
  EXPECT_FALSE(IsDns1123Subdomain("a..b"));
  EXPECT_FALSE(IsDns1123Subdomain("A"));
  EXPECT_FALSE(IsDns1123Subdomain(std::string(254, 'a')));
  EXPECT_TRUE(IsDns1123Subdomain(std::string(253, 'a')));
}

}  // namespace
}  // namespace kvoffload::webhook
