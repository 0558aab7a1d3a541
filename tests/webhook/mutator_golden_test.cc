// Golden cases: testdata/<case>.pod.json (+ optional <case>.cluster.json with the namespace,
// cluster objects and webhook flags) -> <case>.patched.json (the pod after our patch), or
// <case>.denied.txt for a denial; <case>.warnings.json lists the warnings.
//
// Every case runs through both entry points users call, which must agree (as Istio feeds its
// goldens to its webhook and to kube-inject): the webhook (AdmissionHandler::Handle: an
// AdmissionReview in, the answer's JSON patch applied to the pod) and offline `inject`
// (InjectManifests over the cluster objects and the pod). Every admitted case is admitted again,
// through both, and must be a no-op.
//
// The config hash is checked (16 hex digits, the same in the status annotation and
// KVOFFLOAD_CONFIG_HASH, equal to the hash recomputed from the pod's spec and the config
// injected into it) and then written as "<config-hash>", so a change to what the hash covers
// does not rewrite the hash line of every golden.
//
// KVOFFLOAD_UPDATE_GOLDEN=1 rewrites the outputs, but refuses to turn a patched case into a
// denied one or back unless KVOFFLOAD_GOLDEN_ALLOW_FLIP=1 is set too. A golden file no case
// reads fails the suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "webhook/admission.h"
#include "webhook/cluster_reader.h"
#include "webhook/inject.h"
#include "webhook/json_util.h"
#include "webhook/mutator.h"
#include "webhook/resolver.h"
#include "webhook/workload.h"

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kTestdata = KVOFFLOAD_TESTDATA;
constexpr char kHashPlaceholder[] = "<config-hash>";

// Cases whose offline answer differs from the webhook's by design, and why. The test checks
// that they do differ, so an entry cannot outlive its reason.
const std::map<std::string, std::string> kOfflineDiffers = {
    {"denied-missing-pvc",
     "offline, a PVC absent from the manifests may exist in the cluster: inject admits the pod "
     "and warns that the PVC was not checked"},
};

// Files in testdata that are not goldens (the source the KServe-shaped fixtures are rendered
// from, tests/webhook/kserve_fixtures.py).
const std::set<std::string> kNotGoldens = {"kserve-launch.sh.in", "kserve-launch-dp.sh.in"};

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}
bool UpdateGolden() { return EnvIs("KVOFFLOAD_UPDATE_GOLDEN", "1"); }
bool AllowFlip() { return EnvIs("KVOFFLOAD_GOLDEN_ALLOW_FLIP", "1"); }

std::vector<std::string> CaseNames(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".pod.json";
    if (file.size() > suffix.size() && file.ends_with(suffix)) {
      names.push_back(file.substr(0, file.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Golden files no case reads, each with the reason: not named <case>.<kind>, no such case, a
// patch beside a denial (the denial is what is compared), warnings of a denied case (a denial
// has none).
std::vector<std::string> UnusedGoldens(const fs::path& dir) {
  static const std::vector<std::string> kSuffixes = {".pod.json", ".cluster.json", ".patched.json",
                                                     ".denied.txt", ".warnings.json"};
  std::vector<std::string> unused;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (kNotGoldens.count(file) != 0) continue;
    auto suffix = std::find_if(kSuffixes.begin(), kSuffixes.end(), [&](const std::string& s) {
      return file.size() > s.size() && file.ends_with(s);
    });
    if (suffix == kSuffixes.end()) {
      unused.push_back(file + ": not <case>.pod.json, .cluster.json, .patched.json, .denied.txt "
                              "or .warnings.json");
      continue;
    }
    const std::string name = file.substr(0, file.size() - suffix->size());
    const bool denied = fs::exists(dir / (name + ".denied.txt"));
    if (!fs::exists(dir / (name + ".pod.json"))) {
      unused.push_back(file + ": no case " + name + " (no " + name + ".pod.json)");
    } else if (*suffix == ".patched.json" && denied) {
      unused.push_back(file + ": case " + name + " is denied (" + name + ".denied.txt)");
    } else if (*suffix == ".warnings.json" && denied) {
      unused.push_back(file + ": case " + name + " is denied, and a denial has no warnings");
    }
  }
  std::sort(unused.begin(), unused.end());
  return unused;
}

// Why the update mode must not rewrite a case, or "" when it may.
std::string FlipRefusal(const std::string& name, bool was_patched, bool was_denied,
                        bool now_denied, bool allow_flip) {
  if (allow_flip) return "";
  if (was_patched && now_denied) {
    return "case " + name + " was patched and would now be denied; if that is intended, run "
           "again with KVOFFLOAD_GOLDEN_ALLOW_FLIP=1";
  }
  if (was_denied && !now_denied) {
    return "case " + name + " was denied and would now be patched; if that is intended, run "
           "again with KVOFFLOAD_GOLDEN_ALLOW_FLIP=1";
  }
  return "";
}

std::string Base64Decode(const std::string& in) {
  static const std::string kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : in) {
    if (c == '=') break;
    const size_t v = kAlphabet.find(c);
    if (v == std::string::npos) return "<not base64>";
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  return out;
}

struct Case {
  std::string name;
  json pod;
  std::string ns;
  std::vector<json> objects;  // the cluster: namespaces, LLMInferenceServices, PVCs
  Mode default_mode = Mode::kVllmNative;
  std::string agent_image;
};

Case LoadCase(const fs::path& dir, const std::string& name) {
  Case c;
  c.name = name;
  c.pod = json::parse(ReadFile(dir / (name + ".pod.json")));
  const fs::path cluster_file = dir / (name + ".cluster.json");
  const json cluster =
      fs::exists(cluster_file) ? json::parse(ReadFile(cluster_file)) : json::object();
  c.ns = cluster.value("namespace", "default");
  for (const json& o : cluster.value("objects", json::array())) c.objects.push_back(o);
  if (cluster.value("defaultMode", "vllm-native") == "agent") c.default_mode = Mode::kAgent;
  c.agent_image = cluster.value("agentImage", "");
  return c;
}

// What an entry point answered for one pod.
struct Outcome {
  std::string error;  // it gave no answer a user could act on (bad HTTP status, patch failed)
  bool denied = false;
  std::string denial;
  json pod;  // admitted: the pod as it will be created
  json warnings = json::array();
};

Outcome ThroughWebhook(const Case& c, const json& pod) {
  StaticClusterReader reader(c.objects, c.ns, /*authoritative=*/true);
  AdmissionOptions options;
  options.default_mode = c.default_mode;
  options.agent_image = c.agent_image;
  const AdmissionHandler handler(options, &reader);
  const json review = {
      {"apiVersion", "admission.k8s.io/v1"},
      {"kind", "AdmissionReview"},
      {"request",
       {{"uid", "golden-" + c.name},
        {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
        {"operation", "CREATE"},
        {"namespace", c.ns},
        {"object", pod}}}};
  const HttpAnswer answer = handler.Handle("application/json", review.dump());
  Outcome out;
  if (answer.status != 200) {
    out.error = "HTTP " + std::to_string(answer.status) + ": " + answer.body;
    return out;
  }
  const json response = json::parse(answer.body).at("response");
  if (response.at("uid") != "golden-" + c.name) out.error = "uid not echoed: " + answer.body;
  if (!response.at("allowed").get<bool>()) {
    out.denied = true;
    out.denial = response.at("status").at("message").get<std::string>();
    return out;
  }
  out.warnings = response.value("warnings", json::array());
  out.pod = pod;
  if (response.contains("patch")) {
    const json patch = json::parse(Base64Decode(response["patch"].get<std::string>()));
    // nlohmann's patch() fails an add whose parent is missing, as the API server does.
    try {
      out.pod = pod.patch(patch);
    } catch (const json::exception& e) {
      out.error = std::string("the patch does not apply: ") + e.what() + "\n" + patch.dump(2);
    }
  }
  return out;
}

Outcome ThroughInject(const Case& c, const json& pod) {
  json items = json::array();
  for (const json& o : c.objects) items.push_back(o);
  items.push_back(pod);
  InjectOptions options;
  options.default_mode = c.default_mode;
  options.agent_image = c.agent_image;
  options.namespace_name = c.ns;
  const Result<InjectResult> result = InjectManifests(
      json({{"apiVersion", "v1"}, {"kind", "List"}, {"items", items}}).dump(), options);
  // inject names the object on each line and also checks the cluster objects given with the
  // pod (an LLMInferenceService warns about its own spec); the webhook answers for the pod.
  const std::string prefix = DescribeObject(pod, c.ns) + ": ";
  auto pods_own = [&prefix](const std::vector<std::string>& lines) {
    std::vector<std::string> out;
    for (const std::string& line : lines) {
      if (line.rfind(prefix, 0) == 0) out.push_back(line.substr(prefix.size()));
    }
    return out;
  };
  Outcome out;
  if (!result.ok()) {
    if (result.status().code() != StatusCode::kInvalidArgument) {
      out.error = result.status().message();
      return out;
    }
    out.denied = true;
    std::vector<std::string> lines;
    std::istringstream message(result.status().message());
    for (std::string line; std::getline(message, line);) lines.push_back(line);
    const std::vector<std::string> denials = pods_own(lines);
    out.denial = denials.empty() ? "(none for the pod) " + result.status().message()
                                 : JoinDenials(denials);
    return out;
  }
  out.warnings = pods_own(result->warnings);
  const json printed = json::parse(result->output);
  for (const json& item : printed.at("items")) {
    if (item.value("kind", "") != "Pod") continue;
    if (!out.pod.is_null()) out.error = "inject printed more than one Pod";
    out.pod = item;
  }
  if (out.pod.is_null()) out.error = "inject printed no Pod";
  return out;
}

// "" when both entry points gave the same answer, else what differs.
std::string Disagreement(const Outcome& webhook, const Outcome& offline) {
  std::string out;
  if (webhook.error != offline.error) {
    out += "errors: webhook \"" + webhook.error + "\", inject \"" + offline.error + "\"\n";
  }
  if (webhook.denied != offline.denied || webhook.denial != offline.denial) {
    out += "denials: webhook \"" + webhook.denial + "\", inject \"" + offline.denial + "\"\n";
  }
  if (webhook.pod != offline.pod) {
    out += "pods (inject against webhook): " + json::diff(webhook.pod, offline.pod).dump() + "\n";
  }
  if (webhook.warnings != offline.warnings) {
    out += "warnings: webhook " + webhook.warnings.dump() + ", inject " +
           offline.warnings.dump() + "\n";
  }
  return out;
}

// "" when admitting `patched` again changes nothing through either entry point.
std::string IdempotencyProblem(const Case& c, const json& patched) {
  std::string out;
  for (const auto& [entry, outcome] :
       {std::pair{"webhook", ThroughWebhook(c, patched)}, {"inject", ThroughInject(c, patched)}}) {
    if (!outcome.error.empty()) {
      out += std::string(entry) + ": " + outcome.error + "\n";
    } else if (outcome.denied) {
      out += std::string(entry) + " denies its own output: " + outcome.denial + "\n";
    } else if (outcome.pod != patched) {
      out += std::string(entry) + " changes its own output: " +
             json::diff(patched, outcome.pod).dump() + "\n";
    }
  }
  return out;
}

json* TargetOf(json& pod) {
  std::string error;
  const int index = TargetContainer(JsonDocument::Of(pod).Root(), &error);
  return index < 0 ? nullptr : &pod["spec"]["containers"][static_cast<size_t>(index)];
}

json* EnvEntry(json& container, const std::string& name) {
  if (!container.contains("env")) return nullptr;
  for (json& e : container["env"]) {
    if (StringAt(e, "name") == name) return &e;
  }
  return nullptr;
}

// The hash recomputed from the pod's own spec (resolved as the webhook resolves it) and the
// config injected into the pod: the mode in its status, its target container, its
// KVOFFLOAD_TIERS and, in agent mode, the install container's image.
Result<std::string> RecomputedConfigHash(const Case& c, json pod) {
  StaticClusterReader reader(c.objects, c.ns, /*authoritative=*/true);
  Result<Resolution> res = Resolve(pod, c.ns, &reader);
  if (!res.ok()) return res.status();
  if (!res->spec) return Status::InvalidArgument("the patched pod resolves no spec");
  const json annotations = pod["metadata"].value("annotations", json::object());
  Result<json> status = ParseJson(StringAt(annotations, kAnnotationStatus), kAnnotationStatus);
  if (!status.ok()) return status.status();
  Result<Mode> mode = ParseMode(StringAt(*status, "mode"));
  if (!mode.ok()) return mode.status();
  json* container = TargetOf(pod);
  if (container == nullptr) return Status::InvalidArgument("no target container");
  const json* tiers = EnvEntry(*container, "KVOFFLOAD_TIERS");
  if (tiers == nullptr) return Status::InvalidArgument("no KVOFFLOAD_TIERS");
  Result<json> tiers_env = ParseJson(StringAt(*tiers, "value"), "KVOFFLOAD_TIERS");
  if (!tiers_env.ok()) return tiers_env.status();
  std::string agent_image;
  for (const json& init : pod["spec"].value("initContainers", json::array())) {
    if (StringAt(init, "name") == kAgentInitContainer) agent_image = StringAt(init, "image");
  }
  return ConfigHash(*res->spec, *mode, StringAt(*container, "name"), *tiers_env, agent_image);
}

// `pod` with its config hash replaced by kHashPlaceholder in the status annotation and in
// KVOFFLOAD_CONFIG_HASH, after checking that both hold the same 16 hex digits and that they
// equal `recomputed`.
Result<json> NormaliseConfigHash(json pod, const std::string& recomputed) {
  static const std::regex kHash("[0-9a-f]{16}");
  json& annotations = pod["metadata"]["annotations"];
  Result<json> status = ParseJson(StringAt(annotations, kAnnotationStatus), kAnnotationStatus);
  if (!status.ok()) return status.status();
  const std::string hash = StringAt(*status, "configHash");
  if (!std::regex_match(hash, kHash)) {
    return Status::InvalidArgument("status configHash \"" + hash + "\" is not 16 hex digits");
  }
  if (hash != recomputed) {
    return Status::InvalidArgument("status configHash " + hash +
                                   " is not the hash of the pod's config, " + recomputed);
  }
  json* container = TargetOf(pod);
  json* env = container == nullptr ? nullptr : EnvEntry(*container, "KVOFFLOAD_CONFIG_HASH");
  if (env == nullptr || StringAt(*env, "value") != hash) {
    return Status::InvalidArgument("KVOFFLOAD_CONFIG_HASH is not the status configHash " + hash);
  }
  (*status)["configHash"] = kHashPlaceholder;
  annotations[kAnnotationStatus] = status->dump();  // as the mutator writes it
  (*env)["value"] = kHashPlaceholder;
  return pod;
}

// Both entry points' answers for the case, checked against each other and for idempotency;
// admitted pods come back with the hash normalised.
struct Answered {
  Outcome webhook;
  Outcome offline;
  json normalised;  // the webhook's pod, hash replaced; null when denied
};

void Answer(const Case& c, Answered* out) {
  out->webhook = ThroughWebhook(c, c.pod);
  out->offline = ThroughInject(c, c.pod);
  ASSERT_EQ(out->webhook.error, "");
  ASSERT_EQ(out->offline.error, "");
  const std::string disagreement = Disagreement(out->webhook, out->offline);
  if (auto differs = kOfflineDiffers.find(c.name); differs != kOfflineDiffers.end()) {
    ASSERT_NE(disagreement, "") << "case " << c.name << " is listed as answered differently "
                                << "offline (" << differs->second
                                << "), but both entry points agree: take it off the list";
  } else {
    ASSERT_EQ(disagreement, "") << "webhook and inject disagree on case " << c.name;
  }
  if (out->webhook.denied) return;
  // Reinvocation / re-apply: admitting our own output changes nothing.
  ASSERT_EQ(IdempotencyProblem(c, out->webhook.pod), "") << "case " << c.name;
  Result<std::string> recomputed = RecomputedConfigHash(c, out->webhook.pod);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status().message();
  Result<json> normalised = NormaliseConfigHash(out->webhook.pod, *recomputed);
  ASSERT_TRUE(normalised.ok()) << "case " << c.name << ": " << normalised.status().message();
  out->normalised = std::move(*normalised);
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, BothEntryPointsMatchTheGolden) {
  const std::string name = GetParam();
  const Case c = LoadCase(kTestdata, name);
  const fs::path patched_file = kTestdata / (name + ".patched.json");
  const fs::path denied_file = kTestdata / (name + ".denied.txt");
  const fs::path warnings_file = kTestdata / (name + ".warnings.json");

  Answered got;
  ASSERT_NO_FATAL_FAILURE(Answer(c, &got));
  const Outcome& webhook = got.webhook;

  if (UpdateGolden()) {
    const std::string refusal = FlipRefusal(name, fs::exists(patched_file),
                                            fs::exists(denied_file), webhook.denied, AllowFlip());
    ASSERT_EQ(refusal, "");
    fs::remove(patched_file);
    fs::remove(denied_file);
    fs::remove(warnings_file);
    if (webhook.denied) {
      WriteFile(denied_file, webhook.denial + "\n");
    } else {
      WriteFile(patched_file, got.normalised.dump(2) + "\n");
    }
    if (!webhook.warnings.empty()) WriteFile(warnings_file, webhook.warnings.dump(2) + "\n");
    return;
  }

  const json expected_warnings =
      fs::exists(warnings_file) ? json::parse(ReadFile(warnings_file)) : json::array();
  EXPECT_EQ(webhook.warnings, expected_warnings);
  if (fs::exists(denied_file)) {
    std::string want = ReadFile(denied_file);
    want.erase(want.find_last_not_of('\n') + 1);
    EXPECT_TRUE(webhook.denied) << "case " << name << " is admitted, its golden is a denial";
    EXPECT_EQ(webhook.denial, want);
    return;
  }
  ASSERT_FALSE(webhook.denied) << webhook.denial;
  ASSERT_TRUE(fs::exists(patched_file)) << "missing " << patched_file;
  const json expected = json::parse(ReadFile(patched_file));
  EXPECT_EQ(got.normalised, expected) << "diff: " << json::diff(expected, got.normalised).dump(2);
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTest, ::testing::ValuesIn(CaseNames(kTestdata)),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(GoldenSetTest, HasEnoughCases) { EXPECT_GE(CaseNames(kTestdata).size(), 15u); }

TEST(GoldenSetTest, EveryGoldenFileIsUsed) {
  const std::vector<std::string> unused = UnusedGoldens(kTestdata);
  EXPECT_TRUE(unused.empty()) << json(unused).dump(2);
}

TEST(GoldenSetTest, OfflineDifferencesNameRealCases) {
  const std::vector<std::string> names = CaseNames(kTestdata);
  for (const auto& [name, why] : kOfflineDiffers) {
    EXPECT_TRUE(std::binary_search(names.begin(), names.end(), name)) << name << ": " << why;
  }
}

// The checks of the harness itself, each fed what it exists to catch.

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("golden-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
             std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(GoldenHarnessTest, ReportsGoldenFilesNoCaseUses) {
  TempDir dir;
  for (const char* f : {"a.pod.json", "a.patched.json", "a.warnings.json", "b.patched.json",
                        "c.pod.json", "c.denied.txt", "c.warnings.json", "c.patched.json",
                        "a.patch.json", "kserve-launch.sh.in"}) {
    WriteFile(dir.path() / f, "{}\n");
  }
  const std::vector<std::string> unused = UnusedGoldens(dir.path());
  ASSERT_EQ(unused.size(), 4u) << json(unused).dump(2);
  EXPECT_EQ(unused[0].rfind("a.patch.json: not <case>.pod.json", 0), 0u) << unused[0];
  EXPECT_EQ(unused[1], "b.patched.json: no case b (no b.pod.json)");
  EXPECT_EQ(unused[2], "c.patched.json: case c is denied (c.denied.txt)");
  EXPECT_EQ(unused[3], "c.warnings.json: case c is denied, and a denial has no warnings");
}

TEST(GoldenHarnessTest, UpdateRefusesToFlipACaseUnlessAllowed) {
  const std::string to_denied = FlipRefusal("first-container", true, false, true, false);
  EXPECT_NE(to_denied.find("case first-container was patched and would now be denied"),
            std::string::npos)
      << to_denied;
  EXPECT_NE(to_denied.find("KVOFFLOAD_GOLDEN_ALLOW_FLIP=1"), std::string::npos);
  EXPECT_NE(FlipRefusal("denied-memory-limit", false, true, false, false)
                .find("case denied-memory-limit was denied and would now be patched"),
            std::string::npos);
  EXPECT_EQ(FlipRefusal("first-container", true, false, true, true), "");
  EXPECT_EQ(FlipRefusal("first-container", true, false, false, false), "");
  EXPECT_EQ(FlipRefusal("denied-memory-limit", false, true, true, false), "");
  EXPECT_EQ(FlipRefusal("new-case", false, false, true, false), "");
}

TEST(GoldenHarnessTest, ConfigHashMustBeWellFormedAndTheConfigsOwn) {
  const Case c = LoadCase(kTestdata, "agent-mode-default");
  const Outcome admitted = ThroughWebhook(c, c.pod);
  ASSERT_EQ(admitted.error, "");
  ASSERT_FALSE(admitted.denied) << admitted.denial;
  Result<std::string> recomputed = RecomputedConfigHash(c, admitted.pod);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status().message();

  Result<json> normalised = NormaliseConfigHash(admitted.pod, *recomputed);
  ASSERT_TRUE(normalised.ok()) << normalised.status().message();
  const std::string text = normalised->dump();
  EXPECT_EQ(text.find(*recomputed), std::string::npos);
  EXPECT_NE(text.find(R"(\"configHash\":\"<config-hash>\")"), std::string::npos);
  EXPECT_NE(text.find(R"("name":"KVOFFLOAD_CONFIG_HASH","value":"<config-hash>")"),
            std::string::npos);

  // A hash that is not the injected config's: the pod runs another agent image than the one
  // its hash was taken over.
  json edited = admitted.pod;
  for (json& init : edited["spec"]["initContainers"]) {
    if (init["name"] == kAgentInitContainer) init["image"] = c.agent_image + "-other";
  }
  Result<std::string> edited_hash = RecomputedConfigHash(c, edited);
  ASSERT_TRUE(edited_hash.ok()) << edited_hash.status().message();
  EXPECT_NE(*edited_hash, *recomputed);
  Result<json> mismatch = NormaliseConfigHash(edited, *edited_hash);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("is not the hash of the pod's config"),
            std::string::npos)
      << mismatch.status().message();

  // Malformed in the status, or not the same in the env.
  json bad = admitted.pod;
  std::string status = bad["metadata"]["annotations"][kAnnotationStatus];
  status.replace(status.find(*recomputed), recomputed->size(), "XYZ");
  bad["metadata"]["annotations"][kAnnotationStatus] = status;
  Result<json> malformed = NormaliseConfigHash(bad, *recomputed);
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("\"XYZ\" is not 16 hex digits"), std::string::npos);
  bad = admitted.pod;
  (*EnvEntry(*TargetOf(bad), "KVOFFLOAD_CONFIG_HASH"))["value"] = "0000000000000000";
  EXPECT_FALSE(NormaliseConfigHash(bad, *recomputed).ok());
}

TEST(GoldenHarnessTest, AConfigChangeLeavesTheHashLinesAlone) {
  // Another agent image changes the config hash; the normalised pod differs from the golden
  // only where the image is written, not in the status annotation or KVOFFLOAD_CONFIG_HASH.
  Case c = LoadCase(kTestdata, "agent-mode-default");
  c.agent_image = "registry.example.com/kv-offload/agent:0.2.0";
  Answered got;
  ASSERT_NO_FATAL_FAILURE(Answer(c, &got));
  const json golden = json::parse(ReadFile(kTestdata / "agent-mode-default.patched.json"));
  const json diff = json::diff(golden, got.normalised);
  ASSERT_EQ(diff.size(), 1u) << diff.dump(2);
  EXPECT_EQ(diff[0]["path"], "/spec/initContainers/1/image");  // after KServe's initializer
  EXPECT_EQ(diff[0]["value"], c.agent_image);
}

TEST(GoldenHarnessTest, IdempotencyCheckCatchesASecondPatch) {
  // The golden itself carries the placeholder, not the config's hash: admitting it again
  // patches the hash back in, which the check must report for both entry points.
  const Case c = LoadCase(kTestdata, "first-container");
  const json golden = json::parse(ReadFile(kTestdata / "first-container.patched.json"));
  const std::string problem = IdempotencyProblem(c, golden);
  EXPECT_NE(problem.find("webhook changes its own output"), std::string::npos) << problem;
  EXPECT_NE(problem.find("inject changes its own output"), std::string::npos) << problem;
}

TEST(GoldenHarnessTest, DisagreementNamesWhatDiffers) {
  Outcome webhook;
  webhook.pod = {{"a", 1}};
  webhook.warnings = {"w"};
  Outcome offline = webhook;
  EXPECT_EQ(Disagreement(webhook, offline), "");
  offline.pod["a"] = 2;
  offline.warnings = json::array();
  const std::string d = Disagreement(webhook, offline);
  EXPECT_NE(d.find("pods (inject against webhook)"), std::string::npos) << d;
  EXPECT_NE(d.find("warnings: webhook [\"w\"], inject []"), std::string::npos) << d;
}

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
