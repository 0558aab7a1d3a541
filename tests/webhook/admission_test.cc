#include "webhook/admission.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <map>
#include <string>
#include <vector>

#include "webhook/cluster_reader.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

json PodWithSpec(const std::string& spec_json) {
  return {{"metadata",
           {{"generateName", "vllm-"},
            {"labels", {{"app", "x"}}},
            {"annotations", {{kAnnotationConfig, spec_json}}}}},
          {"spec", {{"containers", {{{"name", "main"}, {"image", "vllm"}}}}}}};
}

json Review(json pod, const std::string& operation = "CREATE") {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "uid-1"},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "team-a"},
            {"operation", operation},
            {"dryRun", false},
            {"object", std::move(pod)}}}};
}

json Response(const HttpAnswer& a) {
  EXPECT_EQ(a.status, 200) << a.body;
  return json::parse(a.body)["response"];
}

std::string Unbase64(const std::string& in) {
  std::string out(in.size(), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

// A reader that cannot reach the API server.
class DownReader : public ClusterReader {
 public:
  Result<std::optional<json>> GetBefore(const ObjectRef&, Deadline) override {
    return Status::Unavailable("connection refused");
  }
  bool Authoritative() const override { return true; }
};

// Answers nothing, remembering the deadlines it was given.
class DeadlineRecorder : public ClusterReader {
 public:
  Result<std::optional<json>> GetBefore(const ObjectRef&, Deadline deadline) override {
    deadlines.push_back(deadline);
    return Status::Unavailable("connection refused");
  }
  bool Authoritative() const override { return true; }
  std::vector<Deadline> deadlines;
};

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionHandler handler_{AdmissionOptions{}, nullptr};
};

TEST_F(AdmissionTest, InjectsAndEchoesUid) {
  const json pod = PodWithSpec(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"5Gi"}}}]})");
  HttpAnswer a = handler_.Handle("application/json", Review(pod).dump());
  json r = Response(a);
  EXPECT_EQ(a.admission.outcome(), Outcome::kInjected);
  EXPECT_EQ(r["uid"], "uid-1");
  EXPECT_EQ(r["allowed"], true);
  EXPECT_EQ(r["patchType"], "JSONPatch");
  json patched = pod.patch(json::parse(Unbase64(r["patch"].get<std::string>())));
  EXPECT_EQ(patched["spec"]["volumes"][0]["name"], "kv-cache-secondary-0");
  // dryRun requests are handled the same way: the webhook has no side effects.
  json dry = Review(pod);
  dry["request"]["dryRun"] = true;
  EXPECT_EQ(Response(handler_.Handle("application/json; charset=utf-8", dry.dump()))["patch"], r["patch"]);
}

// The log line of an admission said only its outcome: no uid to find it by in the API server's
// events, and a status of 200 (the HTTP one) for denials and lookup failures alike. The answer
// carries the request's uid and a denial's status.code for the log.
TEST_F(AdmissionTest, AnAnswerCarriesItsUidAndADenialsCodeForTheLog) {
  const HttpAnswer injected = handler_.Handle(
      "application/json", Review(PodWithSpec(R"({"cpu":"1Gi"})")).dump());
  EXPECT_EQ(injected.admission.outcome(), Outcome::kInjected);
  EXPECT_EQ(injected.uid, "uid-1");
  EXPECT_EQ(injected.code, 0);
  const HttpAnswer denied = handler_.Handle(
      "application/json", Review(PodWithSpec(R"({"cpu":"ten"})")).dump());
  EXPECT_EQ(Response(denied)["status"]["code"], 403);
  EXPECT_EQ(denied.uid, "uid-1");
  EXPECT_EQ(denied.code, 403);
  DownReader down;
  AdmissionHandler looking({}, &down);
  json in_namespace = Review(PodWithSpec(R"({"cpu":"1Gi"})"));
  in_namespace["request"]["object"]["metadata"]["annotations"].erase(kAnnotationConfig);
  const HttpAnswer failed = looking.Handle("application/json", in_namespace.dump());
  EXPECT_EQ(failed.admission.outcome(), Outcome::kError) << failed.body;
  EXPECT_EQ(failed.code, 500);
}

TEST_F(AdmissionTest, BadRequestsGetErrorAnswers) {
  HttpAnswer wrong_type = handler_.Handle("text/plain", "{}");
  EXPECT_EQ(wrong_type.status, 415);
  EXPECT_EQ(handler_.Handle("application/jsonx", "{}").status, 415);
  EXPECT_EQ(handler_.Handle("", "{}").status, 415);
  // Media types are case-insensitive (RFC 9110): read as JSON, so a 400 for "{}", not a 415.
  for (const char* type : {"Application/JSON", "application/json ; charset=utf-8"}) {
    EXPECT_EQ(Response(handler_.Handle(type, "{}"))["status"]["code"], 400) << type;
  }

  json not_json = Response(handler_.Handle("application/json", "{\"kind\":"));
  EXPECT_EQ(not_json["allowed"], false);
  EXPECT_EQ(not_json["status"]["code"], 400);
  EXPECT_NE(not_json["status"]["message"].get<std::string>().find("not valid JSON"), std::string::npos);

  json no_uid = Review(PodWithSpec("{}"));
  no_uid["request"].erase("uid");
  EXPECT_EQ(Response(handler_.Handle("application/json", no_uid.dump()))["status"]["code"], 400);

  json deployment = Review(PodWithSpec("{}"));
  deployment["request"]["kind"] = {{"group", "apps"}, {"version", "v1"}, {"kind", "Deployment"}};
  json r = Response(handler_.Handle("application/json", deployment.dump()));
  EXPECT_EQ(r["uid"], "uid-1");
  EXPECT_EQ(r["allowed"], false);
  EXPECT_NE(r["status"]["message"].get<std::string>().find("Pods only"), std::string::npos);

  json v1beta1 = Review(PodWithSpec("{}"));
  v1beta1["apiVersion"] = "admission.k8s.io/v1beta1";
  EXPECT_EQ(Response(handler_.Handle("application/json", v1beta1.dump()))["status"]["code"], 400);

  json not_review = {{"kind", "Pod"}};
  EXPECT_EQ(Response(handler_.Handle("application/json", not_review.dump()))["allowed"], false);

  json no_object = Review(PodWithSpec("{}"));
  no_object["request"].erase("object");
  EXPECT_EQ(Response(handler_.Handle("application/json", no_object.dump()))["status"]["code"], 400);

  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  json deep_r = Response(handler_.Handle("application/json", deep));
  EXPECT_NE(deep_r["status"]["message"].get<std::string>().find("nests deeper"), std::string::npos);

  EXPECT_EQ(handler_.Handle("application/json", std::string(kMaxAdmissionBodyBytes + 1, ' ')).status, 413);
}

TEST_F(AdmissionTest, DenialsNameFieldAndSource) {
  json r = Response(handler_.Handle("application/json", Review(PodWithSpec(R"({"cpu":"0"})")).dump()));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["code"], 403);
  const std::string msg = r["status"]["message"];
  EXPECT_NE(msg.find("kvCacheOffloading.cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pod annotation kvoffload.io/config"), std::string::npos) << msg;
}

TEST_F(AdmissionTest, SkipsWhatIsNotOurs) {
  json update = Review(PodWithSpec(R"({"cpu":"1Gi"})"), "UPDATE");
  HttpAnswer a = handler_.Handle("application/json", update.dump());
  EXPECT_EQ(a.admission.outcome(), Outcome::kSkipped);
  EXPECT_FALSE(Response(a).contains("patch"));

  json opted_out = PodWithSpec(R"({"cpu":"1Gi"})");
  opted_out["metadata"]["labels"][kLabelInject] = "false";
  a = handler_.Handle("application/json", Review(opted_out).dump());
  EXPECT_EQ(a.admission.outcome(), Outcome::kSkipped);
  EXPECT_FALSE(Response(a).contains("patch"));

  json asked = {{"metadata", {{"labels", {{kLabelInject, "true"}}}}},
                {"spec", {{"containers", {{{"name", "main"}}}}}}};
  a = handler_.Handle("application/json", Review(asked).dump());
  json r = Response(a);
  EXPECT_EQ(r["allowed"], true);
  ASSERT_TRUE(r.contains("warnings"));
  EXPECT_NE(r["warnings"][0].get<std::string>().find("no kvCacheOffloading spec"), std::string::npos);
}

// The kvoffload.io/status annotation the handler's patch writes on `container`'s pod.
json StatusAfterAdmission(const AdmissionHandler& handler, json container,
                          const std::map<std::string, std::string>& annotations) {
  json pod = PodWithSpec(R"({"cpu":"1Gi"})");
  for (const auto& [k, v] : annotations) pod["metadata"]["annotations"][k] = v;
  container["name"] = "main";
  pod["spec"]["containers"] = json::array({container});
  HttpAnswer a = handler.Handle("application/json", Review(pod).dump());
  EXPECT_EQ(a.admission.outcome(), Outcome::kInjected) << a.body;
  json r = Response(a);
  if (!r.contains("patch")) return json();
  json patched = pod.patch(json::parse(Unbase64(r["patch"].get<std::string>())));
  return json::parse(patched["metadata"]["annotations"][kAnnotationStatus].get<std::string>());
}

TEST_F(AdmissionTest, StatusSaysWhetherTheVllmFlagWasInjectedAndWhyNot) {
  const std::map<std::string, std::string> vllm = {{kAnnotationVllm, "true"}};
  const json exec = {{"command", {"vllm", "serve", "/mnt/models"}}};

  json s = StatusAfterAdmission(handler_, exec, vllm);
  EXPECT_EQ(s["vllmFlagInjected"], true) << s;
  EXPECT_EQ(s["vllmFlag"], "args") << s;
  EXPECT_FALSE(s.contains("vllmFlagReason")) << s;
  EXPECT_EQ(s["mode"], "vllm-native");
  EXPECT_EQ(s["tiers"], json::array());

  // Not marked as vLLM: the tiers and env are injected, the flag is not.
  s = StatusAfterAdmission(handler_, exec, {});
  EXPECT_EQ(s["vllmFlagInjected"], false) << s;
  EXPECT_EQ(s["vllmFlagReason"], kFlagReasonNotVllm) << s;
  EXPECT_FALSE(s.contains("vllmFlag")) << s;

  json theirs = exec;
  theirs["args"] = {"--kv-transfer-config",
                    R"({"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"})"};
  s = StatusAfterAdmission(handler_, theirs, vllm);
  EXPECT_EQ(s["vllmFlagInjected"], false) << s;
  EXPECT_EQ(s["vllmFlag"], "user") << s;
  EXPECT_EQ(s["vllmFlagReason"], kFlagReasonUserFlag) << s;

  json broken = exec;
  broken["args"] = {"--kv-transfer-config={kv_connector:"};
  s = StatusAfterAdmission(handler_, broken, vllm);
  EXPECT_EQ(s["vllmFlagInjected"], false) << s;
  EXPECT_EQ(s["vllmFlagReason"], kFlagReasonUserFlagInvalid) << s;

  // A script that forwards no arguments and reads no VLLM_ADDITIONAL_ARGS.
  const json closed = {{"command", {"/bin/sh", "-c", "exec vllm serve /mnt/models --port 8000"}}};
  s = StatusAfterAdmission(handler_, closed, vllm);
  EXPECT_EQ(s["vllmFlagInjected"], false) << s;
  EXPECT_EQ(s["vllmFlag"], "not-injected") << s;
  EXPECT_EQ(s["vllmFlagReason"], kFlagReasonLaunchDropsArgs) << s;
}

// The namespace goes into every lookup's path: one that is no name (a review posted to the
// webhook by something other than the API server) is a bad request, never a lookup.
TEST(AdmissionLookupTest, NamespaceThatIsNoNameIsABadRequestNotALookup) {
  class Recording : public ClusterReader {
   public:
    Result<std::optional<json>> GetBefore(const ObjectRef& ref, Deadline) override {
      asked.push_back(ref.ToString());
      return std::optional<json>();
    }
    bool Authoritative() const override { return true; }
    std::vector<std::string> asked;
  } reader;
  AdmissionHandler handler(AdmissionOptions{}, &reader);
  const json pod = {{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                              {"app.kubernetes.io/name", "llama"}}}}},
                    {"spec", {{"containers", {{{"name", "main"}}}}}}};
  for (const char* ns : {"../../apis/x", "team-a/secrets", "Team-A", "a?b"}) {
    json review = Review(pod);
    review["request"]["namespace"] = ns;
    HttpAnswer a = handler.Handle("application/json", review.dump());
    json r = Response(a);
    EXPECT_EQ(r["allowed"], false) << ns;
    EXPECT_EQ(r["status"]["code"], 400) << ns;
    EXPECT_NE(r["status"]["message"].get<std::string>().find("request.namespace"),
              std::string::npos) << r;
    EXPECT_EQ(a.admission.outcome(), Outcome::kError) << ns;

    json validate = review;
    validate["request"]["kind"] = {{"group", "apps"}, {"version", "v1"}, {"kind", "Deployment"}};
    validate["request"]["object"] = {
        {"apiVersion", "apps/v1"},
        {"kind", "Deployment"},
        {"metadata", {{"name", "d"}}},
        {"spec", {{"template", {{"spec", {{"containers", {{{"name", "main"}}}}}}}}}}};
    r = Response(handler.Validate("application/json", validate.dump(), false));
    EXPECT_EQ(r["status"]["code"], 400) << ns << ": " << r;
  }
  EXPECT_TRUE(reader.asked.empty()) << reader.asked[0];
  // A name is looked up as before.
  Response(handler.Handle("application/json", Review(pod).dump()));
  EXPECT_FALSE(reader.asked.empty());
}

TEST(AdmissionLookupTest, UnreachableApiServerIsAnErrorNotAHang) {
  DownReader down;
  AdmissionHandler handler(AdmissionOptions{}, &down);
  json pod = {{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                        {"app.kubernetes.io/name", "llama"}}}}},
              {"spec", {{"containers", {{{"name", "main"}}}}}}};
  HttpAnswer a = handler.Handle("application/json", Review(pod).dump());
  json r = Response(a);
  EXPECT_EQ(a.admission.outcome(), Outcome::kError);
  EXPECT_EQ(r["status"]["code"], 500);
  EXPECT_NE(r["status"]["message"].get<std::string>().find("LLMInferenceService team-a/llama"),
            std::string::npos);
}


TEST(AdmissionBudgetTest, LookupsShareABudgetFromWhenTheRequestArrived) {
  // The budget started when a worker took the request: one queued behind others (up to the
  // pool's size waiting on a slow API server) still got all of it, and answered after the API
  // server had given up on it. It starts when the request was read whole.
  DeadlineRecorder reader;
  AdmissionOptions options;
  options.lookup_budget = std::chrono::milliseconds(2000);
  AdmissionHandler handler(options, &reader);
  json pod = {{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                        {"app.kubernetes.io/name", "llama"}}}}},
              {"spec", {{"containers", {{{"name", "main"}}}}}}};
  const auto received = std::chrono::steady_clock::now() - std::chrono::milliseconds(1500);
  handler.Handle("application/json", Review(pod).dump(), received);
  ASSERT_FALSE(reader.deadlines.empty());
  for (const Deadline d : reader.deadlines) {
    EXPECT_EQ(d, received + std::chrono::milliseconds(2000));
  }
}

// --- /validate: apply-time checks ------------------------------------------------------------

json ObjectReview(const std::string& group, const std::string& kind, json object,
                  const std::string& operation = "CREATE", json old_object = nullptr) {
  json review = Review(std::move(object), operation);
  review["request"]["kind"] = {{"group", group}, {"version", "v1alpha2"}, {"kind", kind}};
  review["request"].erase("resource");
  if (!old_object.is_null()) review["request"]["oldObject"] = std::move(old_object);
  return review;
}

json Service(const json& offloading) {
  return {{"apiVersion", "serving.kserve.io/v1alpha2"},
          {"kind", "LLMInferenceService"},
          {"metadata", {{"name", "llama"}, {"namespace", "team-a"}}},
          {"spec",
           {{"template", {{"containers", {{{"name", "main"}, {"resources", {{"limits", {{"memory", "10Gi"}}}}}}}}}},
            {"kvCacheOffloading", offloading}}}};
}

TEST_F(AdmissionTest, ValidateDeniesABadLLMInferenceServiceWithEveryError) {
  const json bad = Service({{"cpu", "ten"}, {"evictionPolicy", "fifo"}});
  HttpAnswer a = handler_.Validate("application/json",
                                   ObjectReview("serving.kserve.io", "LLMInferenceService", bad).dump(),
                                   false);
  json r = Response(a);
  EXPECT_EQ(a.verdict, Verdict::kDenied);
  EXPECT_EQ(r["uid"], "uid-1");
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["code"], 403);
  const std::string msg = r["status"]["message"];
  EXPECT_EQ(msg.rfind("kvCacheOffloading from LLMInferenceService team-a/llama is invalid: "
                      "spec.kvCacheOffloading.cpu: \"ten\" is not a valid quantity",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find("; spec.kvCacheOffloading.evictionPolicy: \"fifo\" is not supported"),
            std::string::npos)
      << msg;
}

TEST_F(AdmissionTest, ValidateWarnsAboutWhatIsLikelyWrong) {
  const json svc = Service({{"cpu", "9Gi"}});
  HttpAnswer a = handler_.Validate(
      "application/json", ObjectReview("serving.kserve.io", "LLMInferenceService", svc).dump(), true);
  json r = Response(a);
  EXPECT_EQ(a.verdict, Verdict::kWarned);
  EXPECT_EQ(r["allowed"], true);
  ASSERT_EQ(r["warnings"].size(), 1u) << r.dump();
  EXPECT_EQ(r["warnings"][0], "kvCacheOffloading.cpu 9Gi is over 80% of container main's memory limit 10Gi");
  EXPECT_LT(r["warnings"][0].get<std::string>().size(), 120u);
}

TEST_F(AdmissionTest, ValidateRatchetsUpdatesAndIgnoresDeletions) {
  const json bad = Service({{"cpu", "ten"}});
  // Stored while the webhook was away: a controller adding a finalizer is not blocked...
  json with_finalizer = bad;
  with_finalizer["metadata"]["finalizers"] = {"serving.kserve.io/llmisvc"};
  HttpAnswer a = handler_.Validate(
      "application/json",
      ObjectReview("serving.kserve.io", "LLMInferenceService", with_finalizer, "UPDATE", bad).dump(),
      false);
  EXPECT_EQ(Response(a)["allowed"], true);
  EXPECT_EQ(a.verdict, Verdict::kSkipped);
  // ...but changing the spec to another bad one is.
  const json worse = Service({{"cpu", "eleven"}});
  a = handler_.Validate(
      "application/json",
      ObjectReview("serving.kserve.io", "LLMInferenceService", worse, "UPDATE", bad).dump(), false);
  EXPECT_EQ(Response(a)["allowed"], false);
  json deleting = worse;
  deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z";
  a = handler_.Validate(
      "application/json",
      ObjectReview("serving.kserve.io", "LLMInferenceService", deleting, "UPDATE", bad).dump(), false);
  EXPECT_EQ(Response(a)["allowed"], true);
}

TEST_F(AdmissionTest, ValidateNamespacesAndWorkloads) {
  json ns = {{"apiVersion", "v1"},
             {"kind", "Namespace"},
             {"metadata", {{"name", "team-z"}, {"annotations", {{kAnnotationDefaultConfig, R"({"cpu":"0"})"}}}}}};
  json review = ObjectReview("", "Namespace", ns);
  review["request"].erase("namespace");
  json r = Response(handler_.Validate("application/json", review.dump(), false));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["message"],
            "kvCacheOffloading from namespace team-z annotation kvoffload.io/default-config is "
            "invalid: kvCacheOffloading.cpu: must be greater than 0, got \"0\"");

  json deployment = {{"apiVersion", "apps/v1"},
                     {"kind", "Deployment"},
                     {"metadata", {{"name", "d"}}},
                     {"spec", {{"template", PodWithSpec(R"({"cpu":"1Gi","secondary":[{}]})")}}}};
  r = Response(handler_.Validate("application/json", ObjectReview("apps", "Deployment", deployment).dump(), false));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_NE(r["status"]["message"].get<std::string>().find(
                "spec.template: kvCacheOffloading from pod annotation kvoffload.io/config is invalid: "
                "kvCacheOffloading.secondary[0].fileSystem: only fileSystem tiers are supported"),
            std::string::npos)
      << r.dump();
  // In a namespace without the injection label, only templates labelled inject=true count.
  HttpAnswer a = handler_.Validate("application/json", ObjectReview("apps", "Deployment", deployment).dump(), true);
  EXPECT_EQ(Response(a)["allowed"], true);
  EXPECT_EQ(a.verdict, Verdict::kSkipped);

  // Every workload kind whose template `validate` and `inject` read is checked at apply time
  // too: a CronJob's, a ReplicaSet's or a DaemonSet's was refused only when its pods were.
  json cronjob = {{"apiVersion", "batch/v1"},
                  {"kind", "CronJob"},
                  {"metadata", {{"name", "c"}}},
                  {"spec", {{"jobTemplate", {{"spec", {{"template", PodWithSpec(R"({"cpu":"0"})")}}}}}}}};
  r = Response(handler_.Validate("application/json", ObjectReview("batch", "CronJob", cronjob).dump(), false));
  EXPECT_EQ(r["allowed"], false) << r.dump();
  EXPECT_NE(r["status"]["message"].get<std::string>().find(
                "spec.jobTemplate.spec.template: kvCacheOffloading from pod annotation"),
            std::string::npos)
      << r.dump();
  for (const char* kind : {"ReplicaSet", "DaemonSet"}) {
    json w = deployment;
    w["kind"] = kind;
    r = Response(handler_.Validate("application/json", ObjectReview("apps", kind, w).dump(), false));
    EXPECT_EQ(r["allowed"], false) << kind << ": " << r.dump();
  }

  // The Deployment controller scales an old ReplicaSet down by updating spec.replicas: its
  // pods do not change, so neither does the verdict on them. Checked in full, a template that
  // no longer passed (the LLMInferenceService changed since) was refused its scale-down and
  // the rollout stopped; an update of the template is checked as before.
  json replica_set = deployment;
  replica_set["kind"] = "ReplicaSet";
  replica_set["spec"]["replicas"] = 3;
  json scaled = replica_set;
  scaled["spec"]["replicas"] = 1;
  HttpAnswer scale = handler_.Validate(
      "application/json",
      ObjectReview("apps", "ReplicaSet", scaled, "UPDATE", replica_set).dump(), false);
  EXPECT_EQ(Response(scale)["allowed"], true) << Response(scale).dump();
  EXPECT_EQ(scale.verdict, Verdict::kSkipped);
  json retemplated = scaled;
  retemplated["spec"]["template"]["metadata"]["labels"]["x"] = "y";
  r = Response(handler_.Validate(
      "application/json",
      ObjectReview("apps", "ReplicaSet", retemplated, "UPDATE", replica_set).dump(), false));
  EXPECT_EQ(r["allowed"], false) << r.dump();
}

TEST_F(AdmissionTest, ValidateRefusesOtherKindsAndAdmitsWhenLookupsFail) {
  json r = Response(handler_.Validate("application/json", Review(PodWithSpec("{}")).dump(), false));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["code"], 400);
  EXPECT_NE(r["status"]["message"].get<std::string>().find("check the webhook's rules"), std::string::npos);
  EXPECT_EQ(handler_.Validate("text/plain", "{}", false).status, 415);

  DownReader down;
  AdmissionHandler with_down(AdmissionOptions{}, &down);
  json deployment = {{"apiVersion", "apps/v1"},
                     {"kind", "Deployment"},
                     {"metadata", {{"name", "d"}}},
                     {"spec", {{"template", {{"spec", {{"containers", {{{"name", "main"}}}}}}}}}}};
  HttpAnswer a = with_down.Validate("application/json",
                                    ObjectReview("apps", "Deployment", deployment).dump(), false);
  r = Response(a);
  EXPECT_EQ(r["allowed"], true);  // the pod webhook checks again; never block an apply
  EXPECT_EQ(a.verdict, Verdict::kError);
  ASSERT_EQ(r["warnings"].size(), 1u);
  EXPECT_NE(r["warnings"][0].get<std::string>().find("could not check Deployment team-a/d"),
            std::string::npos);
}

}  // namespace
}  // namespace kvoffload::webhook
