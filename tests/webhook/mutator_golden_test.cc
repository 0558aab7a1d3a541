// Golden cases: testdata/<case>.pod.json (+ optional <case>.cluster.json with the namespace,
// cluster objects and webhook flags) -> <case>.patched.json (the pod after our patch), or
// <case>.denied.txt for a denial; <case>.warnings.json lists the warnings. Every admitted case
// is admitted again and must be a no-op. KVOFFLOAD_UPDATE_GOLDEN=1 rewrites the outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "webhook/cluster_reader.h"
#include "webhook/mutator.h"
#include "webhook/resolver.h"

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kTestdata = KVOFFLOAD_TESTDATA;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

bool UpdateGolden() {
  const char* v = std::getenv("KVOFFLOAD_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(kTestdata)) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".pod.json";
    if (file.size() > suffix.size() && file.ends_with(suffix)) {
      names.push_back(file.substr(0, file.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct Outcome {
  Mutation mutation;
  Status error;  // resolution failure (a denial too)
};

Outcome Admit(const json& pod, const json& cluster) {
  const std::string ns = cluster.value("namespace", "default");
  std::vector<json> objects;
  for (const json& o : cluster.value("objects", json::array())) objects.push_back(o);
  StaticClusterReader reader(objects, ns, /*authoritative=*/true);
  Result<Resolution> res = Resolve(pod, ns, &reader);
  if (!res.ok()) return {Mutation{}, res.status()};
  EXPECT_TRUE(res->spec.has_value()) << "golden cases must resolve a spec";
  if (!res->spec) return {};
  MutationOptions options;
  options.agent_image = cluster.value("agentImage", "");
  if (cluster.value("defaultMode", "vllm-native") == "agent") options.default_mode = Mode::kAgent;
  const MutationInput in(pod, ns, *res, options);
  return {Mutate(in), Status::Ok()};
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesGoldenAndIsIdempotent) {
  const std::string name = GetParam();
  const json pod = json::parse(ReadFile(kTestdata / (name + ".pod.json")));
  const fs::path cluster_file = kTestdata / (name + ".cluster.json");
  const json cluster =
      fs::exists(cluster_file) ? json::parse(ReadFile(cluster_file)) : json::object();
  const fs::path patched_file = kTestdata / (name + ".patched.json");
  const fs::path denied_file = kTestdata / (name + ".denied.txt");
  const fs::path warnings_file = kTestdata / (name + ".warnings.json");

  Outcome out = Admit(pod, cluster);
  std::string denial;
  if (!out.error.ok()) denial = out.error.message();
  if (!out.mutation.allowed) denial = out.mutation.denial;
  const json warnings = out.mutation.warnings;

  if (UpdateGolden()) {
    fs::remove(patched_file);
    fs::remove(denied_file);
    fs::remove(warnings_file);
    if (!denial.empty()) {
      WriteFile(denied_file, denial + "\n");
    } else {
      WriteFile(patched_file, pod.patch(out.mutation.patch).dump(2) + "\n");
    }
    if (!warnings.empty()) WriteFile(warnings_file, warnings.dump(2) + "\n");
    return;
  }

  const json expected_warnings =
      fs::exists(warnings_file) ? json::parse(ReadFile(warnings_file)) : json::array();
  EXPECT_EQ(warnings, expected_warnings);
  if (fs::exists(denied_file)) {
    std::string want = ReadFile(denied_file);
    want.erase(want.find_last_not_of('\n') + 1);
    EXPECT_EQ(denial, want);
    return;
  }
  ASSERT_TRUE(denial.empty()) << denial;
  ASSERT_TRUE(fs::exists(patched_file)) << "missing " << patched_file;
  // nlohmann's patch() fails an add whose parent is missing, as the API server does.
  json patched;
  ASSERT_NO_THROW(patched = pod.patch(out.mutation.patch)) << out.mutation.patch.dump(2);
  const json expected = json::parse(ReadFile(patched_file));
  EXPECT_EQ(patched, expected) << "diff: " << json::diff(expected, patched).dump(2);

  // Reinvocation / re-apply: admitting our own output changes nothing.
  Outcome again = Admit(patched, cluster);
  ASSERT_TRUE(again.error.ok()) << again.error.message();
  EXPECT_TRUE(again.mutation.allowed) << again.mutation.denial;
  EXPECT_EQ(again.mutation.patch, json::array()) << again.mutation.patch.dump(2);
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTest, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(GoldenSetTest, HasEnoughCases) { EXPECT_GE(CaseNames().size(), 15u); }

// The checker itself must fail where the API server fails, or the goldens prove nothing.
TEST(PatchCheckerTest, AddUnderMissingParentFails) {
  const json pod = {{"spec", json::object()}};
  const json bad = json::parse(R"([{"op":"add","path":"/spec/volumes/-","value":{}}])");
  EXPECT_ANY_THROW((void)pod.patch(bad));
  const json bad_object = json::parse(R"([{"op":"add","path":"/metadata/annotations/x","value":"y"}])");
  EXPECT_ANY_THROW((void)pod.patch(bad_object));
}

}  // namespace
}  // namespace kvoffload::webhook
