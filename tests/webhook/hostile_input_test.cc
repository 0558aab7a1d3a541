// Hostile and extreme admissions: each one gets a clear denial or a correct patch,
// never a crash, a hang, an unbounded message or a patch the API server would reject.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "server_fixture.h"
#include "webhook/admission.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;
using testing::PodReview;

constexpr char kEmptyDirSpec[] =
    R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"5Gi"}}}]})";

json Pod(const std::string& spec_json, json containers = {{{"name", "main"}, {"image", "vllm"}}}) {
  return {{"metadata", {{"name", "vllm-0"}, {"annotations", {{kAnnotationConfig, spec_json}}}}},
          {"spec", {{"containers", std::move(containers)}}}};
}

std::string Unbase64(const std::string& in) {
  std::string out(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  EXPECT_GE(n, 0);
  size_t len = static_cast<size_t>(n);
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) --len;  // padding decodes as 0s
  out.resize(len);
  return out;
}

class HostileInputTest : public ::testing::Test {
 protected:
  // The answer's `response`; the HTTP status must be 200 (an AdmissionReview answer).
  json Handle(const std::string& body) {
    const auto start = std::chrono::steady_clock::now();
    HttpAnswer a = handler_.Handle("application/json", body);
    // Far under the API server's 10 s default: hostile input must not be a slow path.
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    EXPECT_EQ(a.status, 200) << a.body.substr(0, 500);
    return json::parse(a.body)["response"];
  }
  // Expects a denial whose message contains `needle` and stays readable (bounded).
  void ExpectDenied(const std::string& body, int code, const std::string& needle) {
    json r = Handle(body);
    ASSERT_EQ(r["allowed"], false) << r.dump().substr(0, 500);
    EXPECT_EQ(r["status"]["code"], code);
    const std::string message = r["status"]["message"];
    EXPECT_NE(message.find(needle), std::string::npos) << message.substr(0, 500);
    EXPECT_LT(message.size(), 1024u) << "a denial must not echo the hostile input back";
  }
  // Expects an injection and returns the pod with the patch applied (throws on a bad patch,
  // as the API server would reject it).
  json Patched(const json& pod) {
    json r = Handle(PodReview(pod));
    EXPECT_EQ(r["allowed"], true) << r.dump().substr(0, 500);
    if (!r.contains("patch")) {
      ADD_FAILURE() << "no patch: " << r.dump().substr(0, 500);
      return pod;
    }
    return pod.patch(json::parse(Unbase64(r["patch"].get<std::string>())));
  }

  AdmissionHandler handler_{AdmissionOptions{Mode::kAgent, "registry.example/agent:1"}, nullptr};
};

TEST_F(HostileInputTest, QuarterMebibyteValidAnnotationIsInjected) {
  // The API server allows 256 KiB of annotations in total; whitespace keeps the spec valid.
  std::string spec = kEmptyDirSpec;
  spec.insert(1, std::string(256 * 1024 - spec.size(), ' '));
  json patched = Patched(Pod(spec));
  EXPECT_EQ(patched["spec"]["volumes"][0]["name"], "kv-cache-secondary-0");
  EXPECT_EQ(patched["spec"]["volumes"][0]["emptyDir"]["sizeLimit"], "5Gi");
}

TEST_F(HostileInputTest, QuarterMebibyteGarbageAnnotationIsDeniedBriefly) {
  ExpectDenied(PodReview(Pod(std::string(256 * 1024, 'x'))), 403, "kvoffload.io/config");
  // A valid spec with a 256 KiB string where a quantity belongs: the message quotes a prefix.
  ExpectDenied(PodReview(Pod(R"({"cpu":")" + std::string(256 * 1024, '9') + "Gi\"}")), 403,
               "cpu");
}

TEST_F(HostileInputTest, DeeplyNestedJsonIsRefused) {
  // In the body: a bad request (400) that names the limit; the parser does not recurse 100k deep.
  std::string nested = std::string(100000, '[') + std::string(100000, ']');
  json pod = Pod(kEmptyDirSpec);
  std::string body = PodReview(pod);
  body.insert(body.rfind('}'), R"(,"x":)" + nested);
  ExpectDenied(body, 400, "nests deeper than");
  // In the annotation: a denial of the spec, same reason.
  ExpectDenied(PodReview(Pod(std::string(100000, '{') + std::string(100000, '}'))), 403,
               "kvoffload.io/config");
  ExpectDenied(PodReview(Pod(R"({"cpu":"1Gi","x":)" + nested + "}")), 403, "nests deeper than");
}

TEST_F(HostileInputTest, TenThousandEnvEntriesArePatchedCorrectly) {
  json env = json::array();
  for (int i = 0; i < 10000; ++i) {
    env.push_back({{"name", "VAR_" + std::to_string(i)}, {"value", std::to_string(i)}});
  }
  json patched = Patched(Pod(kEmptyDirSpec, {{{"name", "main"}, {"image", "vllm"}, {"env", env}}}));
  const json& out = patched["spec"]["containers"][0]["env"];
  ASSERT_GT(out.size(), 10000u);
  // Every original entry kept, in order, ahead of what the webhook added.
  for (size_t i = 0; i < 10000; ++i) ASSERT_EQ(out[i], env[i]) << i;
  bool has_tiers = false;
  for (const json& e : out) has_tiers |= e["name"] == "KVOFFLOAD_TIERS";
  EXPECT_TRUE(has_tiers);
}

TEST_F(HostileInputTest, UnicodeNames) {
  // A container chosen by a non-ASCII name gets the patch; the name survives byte for byte.
  const std::string name = "modèle-推理-🚀";
  json pod = Pod(kEmptyDirSpec, {{{"name", "sidecar"}, {"image", "x"}},
                                 {{"name", name}, {"image", "vllm"}}});
  pod["metadata"]["annotations"][kAnnotationContainer] = name;
  json patched = Patched(pod);
  EXPECT_EQ(patched["spec"]["containers"][1]["name"], name);
  EXPECT_TRUE(patched["spec"]["containers"][1].contains("volumeMounts"));
  EXPECT_FALSE(patched["spec"]["containers"][0].contains("volumeMounts"));
  // A PVC name is a DNS-1123 subdomain: unicode is denied with the field named.
  ExpectDenied(
      PodReview(Pod(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv-çache"}}}}]})")),
      403, "secondary[0].fileSystem.pvc.ref.name");
  // Invalid UTF-8 in the body is a bad request, not a crash or a mangled patch.
  std::string body = PodReview(Pod(kEmptyDirSpec));
  body.replace(body.find("vllm-0"), 6, "\xff\xfe\xfd");
  ExpectDenied(body, 400, "not valid JSON");
}

TEST_F(HostileInputTest, PvcRefPathEscapes) {
  for (const char* path : {"..", "../etc", "kv/../../etc", "kv/..", "a/./../.."}) {
    SCOPED_TRACE(path);
    ExpectDenied(PodReview(Pod(std::string(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv","path":")") +
                            path + R"("}}}}]})")),
                 403, "'..'");
  }
  for (const char* path : {"/", "/etc/passwd", "//kv"}) {
    SCOPED_TRACE(path);
    ExpectDenied(PodReview(Pod(std::string(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv","path":")") +
                            path + R"("}}}}]})")),
                 403, "leading '/'");
  }
  // Dots that are not a '..' segment are ordinary names.
  json patched = Patched(Pod(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv","path":"..kv/a..b/"}}}}]})"));
  EXPECT_EQ(patched["spec"]["containers"][0]["volumeMounts"][0]["subPath"], "..kv/a..b/");
}

TEST_F(HostileInputTest, NulBytes) {
  // Escaped NUL inside JSON strings: valid JSON, so each field rejects it by name.
  ExpectDenied(PodReview(Pod(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv","path":"kv\u0000/x"}}}}]})")),
               403, "control characters");
  ExpectDenied(PodReview(Pod(R"({"cpu":"1Gi\u0000"})")), 403, "cpu");
  ExpectDenied(PodReview(Pod(R"({"cpu":"1Gi","evictionPolicy":"lru\u0000"})")), 403,
               "evictionPolicy");
  ExpectDenied(PodReview(Pod(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv\u0000"}}}}]})")),
               403, "pvc.ref.name");
  // A raw NUL byte in the body is not JSON.
  std::string body = PodReview(Pod(kEmptyDirSpec));
  body[body.find("vllm-0")] = '\0';
  ExpectDenied(body, 400, "not valid JSON");
  // An annotation value that is a NUL followed by a valid spec is not a valid spec.
  ExpectDenied(PodReview(Pod(std::string(1, '\0') + kEmptyDirSpec)), 403, "kvoffload.io/config");
}

TEST_F(HostileInputTest, MebibyteLaunchScriptsAreReadInBoundedTime) {
  // Each expansion of the script's arguments was read by walking its line back from it: a line
  // of `echo $@$@$@...` held a webhook thread 35 s for 97 KiB, an hour for a mebibyte. Handle()
  // holds each to 2 s; the flag cannot reach vLLM through any of these, so the pod says so.
  std::string dollars;
  for (int i = 0; i < 512 * 1024; ++i) dollars += "$@";
  std::string functions;  // under the 64 KiB past which functions are not read
  while (functions.size() < 60 * 1024) functions += "f() { :; }; ";
  for (const std::string& script :
       {"echo " + dollars, "vllm serve /m; echo " + dollars, "eval \"echo " + dollars + "\"",
        functions + "\nstart() { exec vllm serve /m \"$@\"; }\nstart"}) {
    json pod = Pod(kEmptyDirSpec, {{{"name", "main"},
                                    {"image", "vllm"},
                                    {"command", {"/bin/bash", "-c", script}}}});
    pod["metadata"]["annotations"][kAnnotationVllm] = "true";
    const json patched = Patched(pod);
    const json status =
        json::parse(patched["metadata"]["annotations"][kAnnotationStatus].get<std::string>());
    EXPECT_EQ(status["vllmFlag"], "not-injected") << script.substr(0, 80);
  }
}
TEST_F(HostileInputTest, MebibyteOfEnvExpansionsIsReadInBoundedTime) {
  // The script's expansions of env entries are read for a flag of the user's (EXTRA_ARGS with
  // --kv-transfer-config): a mebibyte of them, of an entry holding the flag, in single quotes,
  // and of as many names, each asked where its quotes stand, would be quadratic. Handle()
  // holds each to 2 s. Where the entry holding the flag is expanded, vLLM gets it: the user's.
  std::string same;
  std::string quoted = "'";
  std::string distinct;
  for (int i = 0; i < 256 * 1024; ++i) {
    same += "$A";
    quoted += "$A";
    distinct += "$A" + std::to_string(i);
  }
  quoted += "'";
  json env = {{{"name", "A"}, {"value", "--kv-transfer-config={}"}}};
  for (const auto& [script, how] : {std::pair{"exec vllm serve /m " + same + " \"$@\"", "user"},
                                    std::pair{"exec vllm serve /m " + quoted + " \"$@\"", "args"},
                                    std::pair{"exec vllm serve /m " + distinct + " \"$@\"",
                                              "args"}}) {
    json pod = Pod(kEmptyDirSpec, {{{"name", "main"},
                                    {"image", "vllm"},
                                    {"command", {"/bin/bash", "-c", script, "--"}},
                                    {"env", env}}});
    pod["metadata"]["annotations"][kAnnotationVllm] = "true";
    const json patched = Patched(pod);
    const json status =
        json::parse(patched["metadata"]["annotations"][kAnnotationStatus].get<std::string>());
    EXPECT_EQ(status["vllmFlag"], how) << script.substr(0, 80);
  }
}

TEST_F(HostileInputTest, StatusAnnotationEditedByHandIsReplaced) {
  // Our status annotation with a field of the wrong type (a string for a boolean), as a hand
  // edit or another tool leaves it: reading it threw, and the admission answered 500, which
  // under failurePolicy Fail refuses the pod with no reason given. It is ours to replace.
  for (const char* status : {R"({"configHash":"x","vllmFlagInjected":"true"})",
                             R"({"configHash":"x","vllmFlagInjected":null,"tiers":"a"})",
                             R"({"configHash":"x","mode":7,"vllmFlag":[]})"}) {
    SCOPED_TRACE(status);
    json pod = Pod(kEmptyDirSpec);
    pod["metadata"]["annotations"][kAnnotationStatus] = status;
    const json patched = Patched(pod);
    const json now =
        json::parse(patched["metadata"]["annotations"][kAnnotationStatus].get<std::string>());
    EXPECT_NE(now["configHash"], "x");
  }
}

TEST_F(HostileInputTest, MebibyteOfNearMissesInALaunchIsReadInBoundedTime) {
  // Text that nearly names what the launch is read for, a mebibyte of it: `$(` before one `)`
  // in args (each `$(` looked for its `)` and hashed the name up to it), the flag printed by
  // an echo (each occurrence on a line is now read, with its command's words), `vllm serve` in
  // a log line's string (each asked where its quotes stand), and `X=X=...` assignments of a
  // name the launch expands (each read to its word's end for an expansion of itself). Handle()
  // holds each to 2 s; none holds a flag that reaches vLLM, so ours is added.
  std::string opens;
  std::string flags;
  std::string launches;
  std::string assignments;
  for (int i = 0; i < 512 * 1024; ++i) opens += "$(";
  for (int i = 0; i < 48 * 1024; ++i) flags += "--kv-transfer-config ";
  for (int i = 0; i < 96 * 1024; ++i) launches += "vllm serve ";
  for (int i = 0; i < 512 * 1024; ++i) assignments += "X=";
  const json env = {{{"name", "A"}, {"value", "a"}}};
  struct Case {
    std::string script;
    json args;
  };
  for (const Case& c :
       {Case{"exec vllm serve /m \"$@\"", {"--", opens + ")", "$(A)"}},
        Case{"echo \"" + flags + "\"; exec vllm serve /m \"$@\"", {"--"}},
        Case{"log \"" + launches + "\"\nexec vllm serve /m \"$@\"", {"--"}},
        Case{assignments + "\nexec vllm serve /m $X \"$@\"", {"--"}}}) {
    json pod = Pod(kEmptyDirSpec, {{{"name", "main"},
                                    {"image", "vllm"},
                                    {"command", {"/bin/bash", "-c", c.script}},
                                    {"args", c.args},
                                    {"env", env}}});
    pod["metadata"]["annotations"][kAnnotationVllm] = "true";
    const json patched = Patched(pod);
    const json status =
        json::parse(patched["metadata"]["annotations"][kAnnotationStatus].get<std::string>());
    EXPECT_EQ(status["vllmFlag"], "args") << c.script.substr(0, 80);
  }
}

TEST_F(HostileInputTest, ManyKubeletReferencesOverALargeEnvAreExpandedInOnePass) {
  // Each $(NAME) in command and args was looked up by walking the env array from its start,
  // and each step of that walk did the same: minutes for 100,000 references over 2,000
  // entries. The last entry of a name is the value, as the kubelet keeps it.
  json env = json::array();
  for (int i = 0; i < 2000; ++i) env.push_back({{"name", "X"}, {"value", std::to_string(i)}});
  json args = json::array();
  for (int i = 0; i < 100000; ++i) args.push_back("$(X)");
  args.push_back("--kv-transfer-config=$(KV)");
  env.push_back({{"name", "KV"}, {"value", R"({"kv_connector":"LMCacheConnectorV1"})"}});
  json pod = Pod(kEmptyDirSpec, {{{"name", "main"},
                                  {"image", "vllm"},
                                  {"command", {"vllm", "serve"}},
                                  {"args", args},
                                  {"env", env}}});
  pod["metadata"]["annotations"][kAnnotationVllm] = "true";
  const json patched = Patched(pod);
  const json status =
      json::parse(patched["metadata"]["annotations"][kAnnotationStatus].get<std::string>());
  EXPECT_EQ(status["vllmFlag"], "user") << status;  // seen through $(KV)
}

// Misshapen objects on the apply-time checks: every one is answered (allowed, or denied with a
// message), never a crash or an error status, and a field of the wrong type is never a denial
// about something else.
TEST_F(HostileInputTest, MisshapenObjectsOnTheChecks) {
  const std::vector<std::pair<std::string, json>> objects = {
      {"LLMInferenceService", json::parse(R"({"kind":"LLMInferenceService","metadata":{"name":7},"spec":"x"})")},
      {"LLMInferenceService", json::parse(R"({"kind":"LLMInferenceService","spec":{"prefill":[1],"workload":"w","kvCacheOffloading":5}})")},
      {"LLMInferenceService", json::parse(R"({"kind":"LLMInferenceService","spec":{"template":{"containers":"c"},"kvCacheOffloading":{"cpu":"1Gi"}}})")},
      {"LLMInferenceService", json::parse(R"({"kind":"LLMInferenceService","spec":{"template":[],"replicas":"3","kvCacheOffloading":{"cpu":"1Gi"}}})")},
      {"Namespace", json::parse(R"({"kind":"Namespace","metadata":{"annotations":["x"]}})")},
      {"Namespace", json::parse(R"({"kind":"Namespace","metadata":{"name":"n","annotations":{"kvoffload.io/default-config":"\u0000"}}})")},
      {"Deployment", json::parse(R"({"kind":"Deployment","spec":{"template":"t"}})")},
      {"Deployment", json::parse(R"({"kind":"Deployment","spec":{"replicas":-5,"template":{"metadata":{"annotations":{"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}},"spec":{"containers":[]}}}})")},
      {"Job", json::parse(R"({"kind":"Job","spec":[]})")},
      {"LeaderWorkerSet", json::parse(R"({"kind":"LeaderWorkerSet","spec":{"leaderWorkerTemplate":[1,2]}})")},
      {"LeaderWorkerSet", json::parse(R"({"kind":"LeaderWorkerSet","spec":{"leaderWorkerTemplate":{"size":"big","workerTemplate":{"metadata":{"labels":"l","annotations":{"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}}}}}})")},
  };
  for (const auto& [kind, object] : objects) {
    const std::string group = kind == "LLMInferenceService" ? "serving.kserve.io"
                              : kind == "Namespace"          ? ""
                              : kind == "Job"                ? "batch"
                              : kind == "LeaderWorkerSet"    ? "leaderworkerset.x-k8s.io"
                                                             : "apps";
    const json review = {{"apiVersion", "admission.k8s.io/v1"},
                         {"kind", "AdmissionReview"},
                         {"request",
                          {{"uid", "u"},
                           {"kind", {{"group", group}, {"version", "v1"}, {"kind", kind}}},
                           {"namespace", "team-a"},
                           {"operation", "CREATE"},
                           {"object", object}}}};
    const HttpAnswer a = handler_.Validate("application/json", review.dump(), false);
    ASSERT_EQ(a.status, 200) << object.dump() << " -> " << a.body;
    const json r = json::parse(a.body)["response"];
    EXPECT_EQ(r["uid"], "u");
    if (r["allowed"] == false) {
      EXPECT_EQ(r["status"]["code"], 403) << object.dump() << " -> " << a.body;
      EXPECT_LT(r["status"]["message"].get<std::string>().size(), 4096u);
    }
  }
}

}  // namespace
}  // namespace kvoffload::webhook
