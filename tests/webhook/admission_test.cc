#include "webhook/admission.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <string>

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
  Result<std::optional<json>> Get(const ObjectRef&) override {
    return Status::Unavailable("connection refused");
  }
  bool Authoritative() const override { return true; }
};

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionHandler handler_{AdmissionOptions{}, nullptr};
};

TEST_F(AdmissionTest, InjectsAndEchoesUid) {
  const json pod = PodWithSpec(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"5Gi"}}}]})");
  HttpAnswer a = handler_.Handle("application/json", Review(pod).dump());
  json r = Response(a);
  EXPECT_EQ(a.outcome, Outcome::kInjected);
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

TEST_F(AdmissionTest, BadRequestsGetErrorAnswers) {
  HttpAnswer wrong_type = handler_.Handle("text/plain", "{}");
  EXPECT_EQ(wrong_type.status, 415);

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
  EXPECT_EQ(a.outcome, Outcome::kSkipped);
  EXPECT_FALSE(Response(a).contains("patch"));

  json opted_out = PodWithSpec(R"({"cpu":"1Gi"})");
  opted_out["metadata"]["labels"][kLabelInject] = "false";
  a = handler_.Handle("application/json", Review(opted_out).dump());
  EXPECT_EQ(a.outcome, Outcome::kSkipped);
  EXPECT_FALSE(Response(a).contains("patch"));

  json asked = {{"metadata", {{"labels", {{kLabelInject, "true"}}}}},
                {"spec", {{"containers", {{{"name", "main"}}}}}}};
  a = handler_.Handle("application/json", Review(asked).dump());
  json r = Response(a);
  EXPECT_EQ(r["allowed"], true);
  ASSERT_TRUE(r.contains("warnings"));
  EXPECT_NE(r["warnings"][0].get<std::string>().find("no kvCacheOffloading spec"), std::string::npos);
}

TEST(AdmissionLookupTest, UnreachableApiServerIsAnErrorNotAHang) {
  DownReader down;
  AdmissionHandler handler(AdmissionOptions{}, &down);
  json pod = {{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                        {"app.kubernetes.io/name", "llama"}}}}},
              {"spec", {{"containers", {{{"name", "main"}}}}}}};
  HttpAnswer a = handler.Handle("application/json", Review(pod).dump());
  json r = Response(a);
  EXPECT_EQ(a.outcome, Outcome::kError);
  EXPECT_EQ(r["status"]["code"], 500);
  EXPECT_NE(r["status"]["message"].get<std::string>().find("LLMInferenceService team-a/llama"),
            std::string::npos);
}

}  // namespace
}  // namespace kvoffload::webhook
