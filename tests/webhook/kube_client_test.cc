// API lookups against a small fake API server over HTTPS: kubeconfig loading, tokens, errors,
// timeouts, the cache's single flight and stale answers, and a pvc.ref check end to end.
#include "webhook/kube_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "fake_api_server.h"
#include "test_pki.h"
#include "webhook/admission.h"
#include "webhook/caching_reader.h"
#include "webhook/resolver.h"

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::MakePki;
using testing::TempDir;
using testing::WriteFileAtomic;
using testing::FakeApiServer;

constexpr char kLlmisvcPath[] = "/apis/serving.kserve.io/v1alpha2/namespaces/team-a/llminferenceservices/llama";

class KubeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    api_ = std::make_unique<FakeApiServer>(dir_);
    api_->Put(kLlmisvcPath, {{"kind", "LLMInferenceService"},
                             {"metadata", {{"name", "llama"}, {"namespace", "team-a"}}},
                             {"spec", {{"replicas", 3}, {"kvCacheOffloading", {{"cpu", "8Gi"}}}}}});
    api_->Put("/api/v1/namespaces/team-a",
              {{"kind", "Namespace"}, {"metadata", {{"name", "team-a"}}}});
    WriteFileAtomic(dir_ / "token", "secret-1\n");
    WriteFileAtomic(dir_ / "kubeconfig", api_->Kubeconfig("token"));
  }
  void TearDown() override {
    api_.reset();
    fs::remove_all(dir_);
  }

  KubeConnection Connection() {
    Result<KubeConnection> c = LoadKubeconfig((dir_ / "kubeconfig").string());
    EXPECT_TRUE(c.ok()) << c.status().message();
    return *c;
  }

  static json LlmisvcPod() {
    return {{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                      {"app.kubernetes.io/name", "llama"}}}}},
            {"spec", {{"containers", {{{"name", "main"}}}}}}};
  }

  fs::path dir_;
  std::unique_ptr<FakeApiServer> api_;
};

TEST_F(KubeClientTest, LoadsKubeconfig) {
  KubeConnection c = Connection();
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, api_->port());
  EXPECT_EQ(c.ca_pem, api_->ca_pem());
  EXPECT_EQ(c.token_file, (dir_ / "token").string());

  WriteFileAtomic(dir_ / "bad", "current-context: nope\ncontexts: []\n");
  Result<KubeConnection> bad = LoadKubeconfig((dir_ / "bad").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("context nope not found"), std::string::npos);
  std::string http = api_->Kubeconfig("token");
  http.replace(http.find("https://"), 8, "http://");
  WriteFileAtomic(dir_ / "http", http);
  EXPECT_NE(LoadKubeconfig((dir_ / "http").string()).status().message().find("https://"), std::string::npos);
  EXPECT_FALSE(LoadKubeconfig((dir_ / "missing").string()).ok());
  WriteFileAtomic(dir_ / "notyaml", "{{{: [");
  EXPECT_NE(LoadKubeconfig((dir_ / "notyaml").string()).status().message().find("not valid YAML"),
            std::string::npos);
}

TEST_F(KubeClientTest, GetsObjectsAndReportsErrors) {
  KubeClusterReader reader(Connection());
  Result<std::optional<json>> svc = reader.Get({ObjectKind::kLLMInferenceService, "team-a", "llama"});
  ASSERT_TRUE(svc.ok()) << svc.status().message();
  ASSERT_TRUE(svc->has_value());
  EXPECT_EQ((**svc)["spec"]["replicas"], 3);

  Result<std::optional<json>> missing = reader.Get({ObjectKind::kPersistentVolumeClaim, "team-a", "nope"});
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());

  // Only the older API version serves this one.
  api_->Put("/apis/serving.kserve.io/v1alpha1/namespaces/team-a/llminferenceservices/old",
            {{"kind", "LLMInferenceService"},
             {"metadata", {{"name", "old"}, {"namespace", "team-a"}}},
             {"spec", json::object()}});
  Result<std::optional<json>> old = reader.Get({ObjectKind::kLLMInferenceService, "team-a", "old"});
  ASSERT_TRUE(old.ok());
  EXPECT_TRUE(old->has_value());

  api_->Put("/api/v1/namespaces/broken", {{"kind", "Status"}, {"message", "etcd is on fire"}}, 500);
  Result<std::optional<json>> broken = reader.Get({ObjectKind::kNamespace, "broken", "broken"});
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(broken.status().message().find("HTTP 500: etcd is on fire"), std::string::npos);
}

TEST_F(KubeClientTest, TimesOutInsteadOfHanging) {
  KubeConnection c = Connection();
  c.timeout = std::chrono::milliseconds(300);
  KubeClusterReader reader(c);
  api_->SetDelay(std::chrono::milliseconds(2000));
  const auto start = std::chrono::steady_clock::now();
  Result<std::optional<json>> r = reader.Get({ObjectKind::kNamespace, "team-a", "team-a"});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(r.ok());
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  api_->SetDelay(std::chrono::milliseconds(0));
}

TEST_F(KubeClientTest, RereadsRotatedToken) {
  KubeClusterReader reader(Connection());
  ASSERT_TRUE(reader.Get({ObjectKind::kNamespace, "team-a", "team-a"}).ok());
  api_->SetToken("secret-2");
  EXPECT_FALSE(reader.Get({ObjectKind::kNamespace, "team-a", "team-a"}).ok());  // 401 with the old one
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a distinct mtime
  WriteFileAtomic(dir_ / "token", "secret-2\n");
  Result<std::optional<json>> r = reader.Get({ObjectKind::kNamespace, "team-a", "team-a"});
  EXPECT_TRUE(r.ok()) << r.status().message();
}

TEST_F(KubeClientTest, ReplicaSetOfEightCostsOneLookup) {
  KubeClusterReader kube(Connection());
  Metrics metrics;
  CachingClusterReader cache(&kube, std::chrono::seconds(10), std::chrono::minutes(5), &metrics);
  api_->SetDelay(std::chrono::milliseconds(200));  // all eight arrive while the first is asking
  std::vector<std::future<bool>> pods;
  for (int i = 0; i < 8; ++i) {
    pods.push_back(std::async(std::launch::async, [&cache] {
      Result<Resolution> r = Resolve(LlmisvcPod(), "team-a", &cache);
      return r.ok() && r->spec.has_value() && r->replicas == 3;
    }));
  }
  for (auto& p : pods) EXPECT_TRUE(p.get());
  EXPECT_EQ(api_->Requests(kLlmisvcPath), 1);
  EXPECT_EQ(metrics.lookups(ObjectKind::kLLMInferenceService, LookupResult::kMiss), 1u);
  EXPECT_EQ(metrics.lookups(ObjectKind::kLLMInferenceService, LookupResult::kHit), 7u);
}

TEST_F(KubeClientTest, ServesRecentAnswerWhenApiServerFails) {
  KubeClusterReader kube(Connection());
  Metrics metrics;
  CachingClusterReader cache(&kube, std::chrono::seconds(0), std::chrono::minutes(5), &metrics);
  ASSERT_TRUE(Resolve(LlmisvcPod(), "team-a", &cache).ok());
  api_->Put(kLlmisvcPath, {{"kind", "Status"}, {"message", "overloaded"}}, 503);
  Result<Resolution> r = Resolve(LlmisvcPod(), "team-a", &cache);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->source.description, "LLMInferenceService team-a/llama");
  EXPECT_EQ(metrics.lookups(ObjectKind::kLLMInferenceService, LookupResult::kStale), 1u);
  // Without a previous answer the failure is reported.
  api_->Put("/api/v1/namespaces/other", {{"message", "overloaded"}}, 503);
  json plain = {{"metadata", json::object()}, {"spec", {{"containers", {{{"name", "main"}}}}}}};
  EXPECT_EQ(Resolve(plain, "other", &cache).status().code(), StatusCode::kUnavailable);
}

TEST_F(KubeClientTest, ForbiddenIsAnAnswerNotAnOutage) {
  // RBAC broken after a first lookup (binding deleted): the old copy hid the 403 for the
  // stale TTL, and only namespaces never looked up before were refused.
  KubeClusterReader kube(Connection());
  CachingClusterReader cache(&kube, std::chrono::seconds(0), std::chrono::minutes(5), nullptr);
  ASSERT_TRUE(Resolve(LlmisvcPod(), "team-a", &cache).ok());
  api_->Put(kLlmisvcPath,
            {{"kind", "Status"},
             {"message", "llminferenceservices.serving.kserve.io \"llama\" is forbidden"}},
            403);
  Result<Resolution> r = Resolve(LlmisvcPod(), "team-a", &cache);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("HTTP 403"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("ClusterRole kv-offload-webhook"), std::string::npos);
}

TEST_F(KubeClientTest, UnauthorizedIsAnAnswerNotAnOutage) {
  // A revoked or expired token after a first lookup: the old copy hid the 401 for the stale
  // TTL, and the denial without one named no cause.
  KubeClusterReader kube(Connection());
  Metrics metrics;
  CachingClusterReader cache(&kube, std::chrono::seconds(0), std::chrono::minutes(5), &metrics);
  ASSERT_TRUE(Resolve(LlmisvcPod(), "team-a", &cache).ok());
  api_->SetToken("secret-2");  // the webhook's token is no longer accepted
  Result<Resolution> r = Resolve(LlmisvcPod(), "team-a", &cache);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("HTTP 401: Unauthorized"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("the webhook's credentials: check its ServiceAccount token"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(metrics.lookups(ObjectKind::kLLMInferenceService, LookupResult::kStale), 0u);
  // Other 4xx are answers too; 429 is the API server shedding load, an outage the old copy
  // bridges like a 503.
  api_->SetToken("secret-1");
  api_->Put(kLlmisvcPath, {{"kind", "Status"}, {"message", "conflict"}}, 409);
  EXPECT_FALSE(Resolve(LlmisvcPod(), "team-a", &cache).ok());
  api_->Put(kLlmisvcPath, {{"kind", "Status"}, {"message", "too many requests"}}, 429);
  Result<Resolution> throttled = Resolve(LlmisvcPod(), "team-a", &cache);
  ASSERT_TRUE(throttled.ok()) << throttled.status().message();
  EXPECT_EQ(metrics.lookups(ObjectKind::kLLMInferenceService, LookupResult::kStale), 1u);
}

TEST_F(KubeClientTest, DeletedObjectIsNotServedWhenTheApiServerThenFails) {
  // A PVC read, then deleted (the denial said so), then a 503: the copy from before the
  // delete stood in, and the pod was admitted with a PVC that no longer exists.
  KubeClusterReader kube(Connection());
  Metrics metrics;
  CachingClusterReader cache(&kube, std::chrono::seconds(0), std::chrono::minutes(5), &metrics);
  const std::string path = "/api/v1/namespaces/team-a/persistentvolumeclaims/kv";
  const ObjectRef pvc{ObjectKind::kPersistentVolumeClaim, "team-a", "kv"};
  api_->Put(path, {{"kind", "PersistentVolumeClaim"},
                   {"metadata", {{"name", "kv"}, {"namespace", "team-a"}}}});
  Result<std::optional<json>> found = cache.Get(pvc);
  ASSERT_TRUE(found.ok() && found->has_value());
  api_->Put(path, {{"kind", "Status"}, {"message", "not found"}}, 404);
  Result<std::optional<json>> gone = cache.Get(pvc);
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  api_->Put(path, {{"kind", "Status"}, {"message", "overloaded"}}, 503);
  Result<std::optional<json>> failed = cache.Get(pvc);
  ASSERT_FALSE(failed.ok()) << "the deleted PVC was served";
  EXPECT_NE(failed.status().message().find("HTTP 503"), std::string::npos);
  EXPECT_EQ(metrics.lookups(ObjectKind::kPersistentVolumeClaim, LookupResult::kStale), 0u);
}

TEST_F(KubeClientTest, WaitersOnALookupCountWhatTheyGot) {
  // Admissions waiting on another's GET were counted as hits whatever came back: three
  // denied with one 500 showed two hits and one error.
  KubeClusterReader kube(Connection());
  Metrics metrics;
  CachingClusterReader cache(&kube, std::chrono::seconds(0), std::chrono::minutes(5), &metrics);
  const ObjectRef ns{ObjectKind::kNamespace, "team-b", "team-b"};
  auto three_at_once = [&] {
    std::vector<std::future<bool>> calls;
    for (int i = 0; i < 3; ++i) {
      calls.push_back(std::async(std::launch::async, [&] { return cache.Get(ns).ok(); }));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the first is in flight
    }
    int ok = 0;
    for (auto& c : calls) ok += c.get() ? 1 : 0;
    return ok;
  };
  api_->Put("/api/v1/namespaces/team-b", {{"kind", "Status"}, {"message", "etcd"}}, 500);
  api_->SetDelay(std::chrono::milliseconds(600));
  EXPECT_EQ(three_at_once(), 0);
  EXPECT_EQ(api_->Requests("/api/v1/namespaces/team-b"), 1);
  EXPECT_EQ(metrics.lookups(ObjectKind::kNamespace, LookupResult::kError), 3u);
  EXPECT_EQ(metrics.lookups(ObjectKind::kNamespace, LookupResult::kHit), 0u);
  // With an older copy, all three get it: three stale answers.
  api_->SetDelay(std::chrono::milliseconds(0));
  api_->Put("/api/v1/namespaces/team-b", {{"kind", "Namespace"}, {"metadata", {{"name", "team-b"}}}});
  ASSERT_TRUE(cache.Get(ns).ok());
  api_->Put("/api/v1/namespaces/team-b", {{"kind", "Status"}, {"message", "etcd"}}, 503);
  api_->SetDelay(std::chrono::milliseconds(600));
  EXPECT_EQ(three_at_once(), 3);
  EXPECT_EQ(metrics.lookups(ObjectKind::kNamespace, LookupResult::kStale), 3u);
  EXPECT_EQ(metrics.lookups(ObjectKind::kNamespace, LookupResult::kHit), 0u);
  api_->SetDelay(std::chrono::milliseconds(0));
  // A fresh answer shared with waiters is a hit for each of them, the one GET a miss.
  const uint64_t misses = metrics.lookups(ObjectKind::kNamespace, LookupResult::kMiss);
  api_->Put("/api/v1/namespaces/team-b", {{"kind", "Namespace"}, {"metadata", {{"name", "team-b"}}}});
  api_->SetDelay(std::chrono::milliseconds(600));
  EXPECT_EQ(three_at_once(), 3);
  EXPECT_EQ(metrics.lookups(ObjectKind::kNamespace, LookupResult::kMiss), misses + 1);
  EXPECT_EQ(metrics.lookups(ObjectKind::kNamespace, LookupResult::kHit), 2u);
  api_->SetDelay(std::chrono::milliseconds(0));
}

TEST_F(KubeClientTest, NamesThatAreNoObjectNamesAreNotLookedUp) {
  // The label and spec.baseRefs names went into the GET's path as written: "llama?x=1" read
  // team-a/llama, "../../team-b/..." another namespace's object.
  KubeClusterReader kube(Connection());
  for (const char* label : {"llama?x=1", "../../team-b/llminferenceservices/llama", "llama#frag",
                            "llama/status", "Llama", "a b"}) {
    json pod = LlmisvcPod();
    pod["metadata"]["labels"]["app.kubernetes.io/name"] = label;
    Result<Resolution> r = Resolve(pod, "team-a", &kube);
    // As for a service that does not exist: the namespace (no default here) decides.
    ASSERT_TRUE(r.ok()) << label << ": " << r.status().message();
    EXPECT_FALSE(r->spec.has_value()) << label << ": " << r->source.description;
  }
  EXPECT_EQ(api_->Requests(kLlmisvcPath), 0);
  api_->Put(kLlmisvcPath,
            {{"kind", "LLMInferenceService"},
             {"metadata", {{"name", "llama"}, {"namespace", "team-a"}}},
             {"spec",
              {{"baseRefs", {{{"name", "../../../team-b/llminferenceserviceconfigs/x"}}}},
               {"kvCacheOffloading", {{"cpu", "8Gi"}}}}}});
  Result<Resolution> r = Resolve(LlmisvcPod(), "team-a", &kube);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("spec.baseRefs[0].name of LLMInferenceService team-a/llama "
                                      "is \"../../../team-b/llminferenceserviceconfigs/x\", which "
                                      "is no LLMInferenceServiceConfig name"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(api_->Requests("/apis/serving.kserve.io/v1alpha2/namespaces/team-b/"
                           "llminferenceserviceconfigs/x"),
            0);
}

TEST_F(KubeClientTest, RefusedConnectionIsNotCalledATimeout) {
  KubeClusterReader kube(Connection());
  api_.reset();  // nothing listens on its port any more: connections are refused at once
  Result<std::optional<json>> r =
      kube.GetBefore(ObjectRef{ObjectKind::kNamespace, "team-a", "team-a"},
                     std::chrono::steady_clock::now() + std::chrono::seconds(1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a timeout"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("--lookup-timeout"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("https://"), std::string::npos) << r.status().message();
}

TEST_F(KubeClientTest, RouterSchedulerPodsAreNotTheServicesWorkload) {
  // KServe labels its router's scheduler pods part-of=llminferenceservice and name=<service>
  // like the workload: they got the service's tiers and the vLLM flag, which the scheduler
  // refuses at start, or were denied for the service's cpu against their memory limit.
  api_->Put("/api/v1/namespaces/team-a",
            {{"kind", "Namespace"},
             {"metadata", {{"name", "team-a"},
                           {"annotations", {{kAnnotationDefaultConfig, R"({"cpu":"1Gi"})"}}}}}});
  KubeClusterReader kube(Connection());
  json scheduler = LlmisvcPod();
  scheduler["metadata"]["labels"]["app.kubernetes.io/component"] =
      "llminferenceservice-router-scheduler";
  Result<Resolution> r = Resolve(scheduler, "team-a", &kube);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->spec.has_value());
  EXPECT_EQ(api_->Requests(kLlmisvcPath), 0);
  EXPECT_EQ(api_->Requests("/api/v1/namespaces/team-a"), 0);
  // Its workload pods, by either label KServe sets, are the service's. (A prefill pod gets
  // spec.prefill's, which this service has not: ValidationTest and the prefill goldens.)
  for (const auto& [label, value] :
       {std::pair{"app.kubernetes.io/component", "llminferenceservice-workload-leader"},
        std::pair{"app.kubernetes.io/component", "llminferenceservice-workload-worker"},
        std::pair{"kserve.io/component", "workload"}}) {
    json workload = LlmisvcPod();
    workload["metadata"]["labels"][label] = value;
    Result<Resolution> w = Resolve(workload, "team-a", &kube);
    ASSERT_TRUE(w.ok()) << w.status().message();
    EXPECT_EQ(w->source.description, "LLMInferenceService team-a/llama") << value;
  }
}

// A platform team's LLMInferenceServiceConfig named in spec.baseRefs carries the offloading
// spec (KServe merges it under the service's own when it renders the pods): its pods got
// nothing, or the namespace default instead.
TEST_F(KubeClientTest, BaseRefsConfigsAreMergedUnderTheServiceAsKServeDoes) {
  const auto config = [](const std::string& ns, const std::string& name, const json& spec) {
    return json{{"kind", "LLMInferenceServiceConfig"},
                {"metadata", {{"name", name}, {"namespace", ns}}},
                {"spec", {{"kvCacheOffloading", spec}}}};
  };
  const std::string configs = "/apis/serving.kserve.io/v1alpha2/namespaces/";
  // Shared in KServe's namespace; "local" also there, but the service's namespace comes first.
  api_->Put(configs + "kserve-system/llminferenceserviceconfigs/shared",
            config("kserve-system", "shared",
                   {{"cpu", "8Gi"},
                    {"evictionPolicy", "lru"},
                    {"secondary", {{{"fileSystem", {{"emptyDir", {{"size", "100Gi"}}}}}}}}}));
  api_->Put(configs + "kserve-system/llminferenceserviceconfigs/local",
            config("kserve-system", "local", {{"evictionPolicy", "lru"}}));
  api_->Put(configs + "team-a/llminferenceserviceconfigs/local",
            config("team-a", "local",
                   {{"cpu", "6Gi"}, {"evictionPolicy", "arc"}, {"secondary", json::array()}}));
  const json based = {{"kind", "LLMInferenceService"},
                      {"metadata", {{"name", "based"}, {"namespace", "team-a"}}},
                      {"spec", {{"baseRefs", {{{"name", "shared"}}, {{"name", "local"}}}}}}};
  api_->Put(configs + "team-a/llminferenceservices/based", based);
  json pod = LlmisvcPod();
  pod["metadata"]["labels"]["app.kubernetes.io/name"] = "based";
  KubeClusterReader kube(Connection());
  Result<Resolution> r = Resolve(pod, "team-a", &kube, "kserve-system");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->spec.has_value());
  EXPECT_EQ(r->spec->cpu.ToString(), "6Gi") << "the later config's";
  EXPECT_EQ(r->spec->eviction_policy, "arc") << "the later config, from the service's namespace";
  ASSERT_EQ(r->spec->secondary.size(), 1u) << "the shared config's tiers: [] sets none";
  EXPECT_EQ(r->spec->secondary[0].size.ToString(), "100Gi");
  EXPECT_EQ(r->source.description,
            "LLMInferenceService team-a/based with LLMInferenceServiceConfig "
            "kserve-system/shared, team-a/local");
  // The service's own spec last, as KServe's Go type writes it: its cpu, its evictionPolicy
  // or the CRD's default lru, the configs' tiers where it lists none.
  json own = based;
  own["spec"]["kvCacheOffloading"] = {{"cpu", "4Gi"}};
  api_->Put(configs + "team-a/llminferenceservices/based", own);
  Result<Resolution> over = Resolve(pod, "team-a", &kube, "kserve-system");
  ASSERT_TRUE(over.ok()) << over.status().message();
  EXPECT_EQ(over->spec->cpu.ToString(), "4Gi");
  EXPECT_EQ(over->spec->eviction_policy, "lru");
  EXPECT_EQ(over->spec->secondary.size(), 1u);

  // A config in neither namespace: KServe renders no pods for the service; a pod that comes
  // anyway is denied, naming it, rather than given a spec KServe would not render.
  api_->Put(configs + "team-a/llminferenceservices/based",
            {{"kind", "LLMInferenceService"},
             {"metadata", {{"name", "based"}, {"namespace", "team-a"}}},
             {"spec", {{"baseRefs", {{{"name", "gone"}}}}}}});
  Result<Resolution> missing = Resolve(pod, "team-a", &kube, "kserve-system");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find(
                "LLMInferenceServiceConfig \"gone\" (spec.baseRefs of LLMInferenceService "
                "team-a/based) is in neither namespace team-a nor kserve-system"),
            std::string::npos)
      << missing.status().message();
}

TEST_F(KubeClientTest, NotFoundIsNotCached) {
  KubeClusterReader kube(Connection());
  CachingClusterReader cache(&kube, std::chrono::seconds(60), std::chrono::minutes(5), nullptr);
  const ObjectRef pvc{ObjectKind::kPersistentVolumeClaim, "team-a", "late"};
  Result<std::optional<json>> before = cache.Get(pvc);
  ASSERT_TRUE(before.ok());
  EXPECT_FALSE(before->has_value());
  api_->Put("/api/v1/namespaces/team-a/persistentvolumeclaims/late",
            {{"kind", "PersistentVolumeClaim"},
             {"metadata", {{"name", "late"}, {"namespace", "team-a"}}}});
  Result<std::optional<json>> after = cache.Get(pvc);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->has_value());
  // An object that exists is kept for the TTL.
  EXPECT_EQ(api_->Requests("/api/v1/namespaces/team-a/persistentvolumeclaims/late"), 2);
  ASSERT_TRUE(cache.Get(pvc).ok());
  EXPECT_EQ(api_->Requests("/api/v1/namespaces/team-a/persistentvolumeclaims/late"), 2);
}

TEST_F(KubeClientTest, PvcRefDeniedUntilThePvcExists) {
  KubeClusterReader kube(Connection());
  AdmissionHandler handler(AdmissionOptions{}, &kube);
  json pod = {{"metadata", {{"annotations", {{"kvoffload.io/config",
      R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv-pvc"}}}}]})"}}}}},
              {"spec", {{"containers", {{{"name", "main"}}}}}}};
  json review = {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"},
                 {"request", {{"uid", "u"}, {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                              {"namespace", "team-a"}, {"operation", "CREATE"}, {"object", pod}}}};
  json denied = json::parse(handler.Handle("application/json", review.dump()).body)["response"];
  EXPECT_EQ(denied["allowed"], false);
  EXPECT_NE(denied["status"]["message"].get<std::string>().find("PersistentVolumeClaim \"kv-pvc\" not found"),
            std::string::npos);
  api_->Put("/api/v1/namespaces/team-a/persistentvolumeclaims/kv-pvc",
            {{"kind", "PersistentVolumeClaim"},
             {"metadata", {{"name", "kv-pvc"}, {"namespace", "team-a"}}},
             {"spec", {{"accessModes", {"ReadWriteMany"}}}},
             {"status", {{"capacity", {{"storage", "1Ti"}}}}}});
  json admitted = json::parse(handler.Handle("application/json", review.dump()).body)["response"];
  EXPECT_EQ(admitted["allowed"], true);
  EXPECT_TRUE(admitted.contains("patch"));
}

// A pod whose spec takes four lookups to find: its LLMInferenceService (which has none), the
// namespace default, then two pvc.ref PVCs.
class LookupBudgetTest : public KubeClientTest {
 protected:
  void SetUp() override {
    KubeClientTest::SetUp();
    api_->Put("/apis/serving.kserve.io/v1alpha2/namespaces/team-b/llminferenceservices/plain",
              {{"kind", "LLMInferenceService"},
               {"metadata", {{"name", "plain"}, {"namespace", "team-b"}}},
               {"spec", json::object()}});
    api_->Put("/api/v1/namespaces/team-b",
              {{"kind", "Namespace"},
               {"metadata", {{"name", "team-b"}, {"annotations", {{kAnnotationDefaultConfig,
                   R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"a"}}}},)"
                   R"({"fileSystem":{"pvc":{"ref":{"name":"b"}}}}]})"}}}}}});
    for (const char* name : {"a", "b"}) {
      api_->Put(std::string("/api/v1/namespaces/team-b/persistentvolumeclaims/") + name,
                {{"kind", "PersistentVolumeClaim"},
                 {"metadata", {{"name", name}, {"namespace", "team-b"}}},
                 {"spec", {{"accessModes", {"ReadWriteMany"}}}},
                 {"status", {{"capacity", {{"storage", "1Ti"}}}}}});
    }
  }

  // The admission's answer and how long it took.
  std::pair<json, std::chrono::milliseconds> Admit(std::chrono::milliseconds budget) {
    KubeClusterReader kube(Connection());
    AdmissionOptions options;
    options.lookup_budget = budget;
    AdmissionHandler handler(options, &kube);
    json pod = {{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                          {"app.kubernetes.io/name", "plain"}}}}},
                {"spec", {{"containers", {{{"name", "main"}}}}}}};
    json review = {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"},
                   {"request", {{"uid", "u"}, {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                                {"namespace", "team-b"}, {"operation", "CREATE"}, {"object", pod}}}};
    const auto start = std::chrono::steady_clock::now();
    json response = json::parse(handler.Handle("application/json", review.dump()).body)["response"];
    return {response, std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)};
  }
};

TEST_F(LookupBudgetTest, AllLookupsOfOneAdmissionShareOneBudget) {
  api_->SetDelay(std::chrono::milliseconds(600));  // four lookups: 2.4 s one after another
  // With room for all four the pod is injected, after every one of them.
  auto [admitted, slow] = Admit(std::chrono::milliseconds(5000));
  EXPECT_EQ(admitted["allowed"], true) << admitted.dump();
  EXPECT_GE(slow, std::chrono::milliseconds(2400));
  // A 1 s budget is what all four share, not what each may take: the answer comes within it
  // (the slack is for a loaded machine, far below the 1.4 s more that the lookups would take)
  // and says which lookup ran out and what to change.
  auto [denied, quick] = Admit(std::chrono::milliseconds(1000));
  EXPECT_EQ(denied["allowed"], false);
  EXPECT_EQ(denied["status"]["code"], 500);
  const std::string message = denied["status"]["message"];
  EXPECT_EQ(message.rfind("could not read ", 0), 0u) << message;
  EXPECT_NE(message.find("team-b"), std::string::npos) << message;
  EXPECT_NE(message.find("--lookup-timeout"), std::string::npos) << message;
  EXPECT_LT(quick, std::chrono::milliseconds(1000 + 400));
  api_->SetDelay(std::chrono::milliseconds(0));
}

TEST_F(LookupBudgetTest, AWaiterOnAnotherAdmissionsLookupKeepsItsOwnDeadline) {
  KubeConnection c = Connection();
  c.timeout = std::chrono::seconds(5);
  KubeClusterReader kube(c);
  Metrics metrics;
  CachingClusterReader cache(&kube, std::chrono::seconds(0), std::chrono::minutes(5), &metrics);
  const ObjectRef ns{ObjectKind::kNamespace, "team-b", "team-b"};
  api_->SetDelay(std::chrono::milliseconds(1500));  // each call in flight for 1.5 s
  std::future<bool> first = std::async(std::launch::async, [&] {
    return cache.GetBefore(ns, std::chrono::steady_clock::now() + std::chrono::seconds(5)).ok();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first call is in flight
  const auto start = std::chrono::steady_clock::now();
  Result<std::optional<json>> second =
      cache.GetBefore(ns, start + std::chrono::milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("--lookup-timeout"), std::string::npos);
  EXPECT_LT(took, std::chrono::milliseconds(300 + 400));  // the first call needs 1.3 s more
  EXPECT_TRUE(first.get());
  // Once an answer exists, a waiter that runs out of time gets it instead of an error.
  std::future<bool> third = std::async(std::launch::async, [&] {
    return cache.GetBefore(ns, std::chrono::steady_clock::now() + std::chrono::seconds(5)).ok();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Result<std::optional<json>> stale =
      cache.GetBefore(ns, std::chrono::steady_clock::now() + std::chrono::milliseconds(300));
  ASSERT_TRUE(stale.ok()) << stale.status().message();
  EXPECT_TRUE(stale->has_value());
  EXPECT_EQ(metrics.lookups(ObjectKind::kNamespace, LookupResult::kStale), 1u);
  EXPECT_TRUE(third.get());
  api_->SetDelay(std::chrono::milliseconds(0));
}

// cpp-httplib's read timeout is per read: a body sent a byte every 0.1 s (headers at once)
// held a 1 s admission for the whole body, 26 s in the tester's run, and one never finished
// held it until the server gave up.
TEST_F(KubeClientTest, SlowOrEndlessBodyEndsWithTheBudget) {
  KubeConnection c = Connection();
  c.timeout = std::chrono::seconds(20);
  KubeClusterReader kube(c);
  const auto get = [&](const ObjectRef& ref) {
    const auto start = std::chrono::steady_clock::now();
    Result<std::optional<json>> r = kube.GetBefore(ref, start + std::chrono::seconds(1));
    return std::pair{r, std::chrono::steady_clock::now() - start};
  };
  api_->SetTrickle(std::chrono::milliseconds(100));  // the LLMInferenceService: about 10 s
  auto [trickled, took] = get({ObjectKind::kLLMInferenceService, "team-a", "llama"});
  ASSERT_FALSE(trickled.ok());
  EXPECT_NE(trickled.status().message().find("lookup budget"), std::string::npos)
      << trickled.status().message();
  EXPECT_LT(took, std::chrono::milliseconds(1000 + 400));
  api_->SetTrickle(std::chrono::milliseconds(0));

  api_->PutEndless("/api/v1/namespaces/endless", " ", std::chrono::milliseconds(50));
  auto [endless, endless_took] = get({ObjectKind::kNamespace, "endless", "endless"});
  ASSERT_FALSE(endless.ok());
  EXPECT_LT(endless_took, std::chrono::milliseconds(1000 + 400));
}

// Rancher-style proxies serve an API server below a path (https://host/k8s/clusters/c-1): it
// was cut off, every lookup got the proxy's 404, and pods were admitted without offloading.
TEST_F(KubeClientTest, ServerUrlPathIsPutBeforeEveryPath) {
  const std::string prefix = "/k8s/clusters/c-1";
  api_->Put(prefix + kLlmisvcPath, {{"kind", "LLMInferenceService"},
                                    {"metadata", {{"name", "llama"}, {"namespace", "team-a"}}},
                                    {"spec", {{"replicas", 5}}}});
  std::string kubeconfig = api_->Kubeconfig("token");
  const std::string port = std::to_string(api_->port());
  kubeconfig.replace(kubeconfig.find(port), port.size(), port + prefix + "/");
  WriteFileAtomic(dir_ / "kubeconfig", kubeconfig);
  KubeClusterReader kube(Connection());
  Result<std::optional<json>> r = kube.Get({ObjectKind::kLLMInferenceService, "team-a", "llama"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((**r)["spec"]["replicas"], 5);
  EXPECT_EQ(api_->Requests(prefix + kLlmisvcPath), 1);
}

// A kubeconfig's tls-server-name was ignored: an API server whose certificate names only
// example.com failed verification against the address, and the name was never checked.
TEST_F(KubeClientTest, TlsServerNameIsTheNameVerified) {
  api_.reset();
  api_ = std::make_unique<FakeApiServer>(dir_, MakePki("named", -60, 3600, "DNS:example.com"));
  api_->Put("/api/v1/namespaces/team-a",
            {{"kind", "Namespace"}, {"metadata", {{"name", "team-a"}}}});
  const auto with_name = [&](const std::string& name) {
    std::string kubeconfig = api_->Kubeconfig("token");
    kubeconfig.insert(kubeconfig.find("    certificate-authority-data"),
                      "    tls-server-name: " + name + "\n");
    WriteFileAtomic(dir_ / "kubeconfig", kubeconfig);
    return KubeClusterReader(Connection()).Get({ObjectKind::kNamespace, "team-a", "team-a"});
  };
  Result<std::optional<json>> named = with_name("example.com");
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_TRUE(named->has_value());
  // The certificate is checked against that name, not merely sent it.
  Result<std::optional<json>> other = with_name("other.example");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("not valid for \"other.example\" (the kubeconfig's "
                                          "tls-server-name)"),
            std::string::npos)
      << other.status().message();
}

// "SSLServerVerification" alone did not say whether the name, the CA or the clock was wrong.
TEST_F(KubeClientTest, TlsVerificationErrorsSayWhichCheckFailed) {
  const auto get_from = [&](const testing::Pki& pki, const std::string& trusted_ca) {
    api_.reset();
    api_ = std::make_unique<FakeApiServer>(dir_, pki);
    WriteFileAtomic(dir_ / "kubeconfig", api_->Kubeconfig("token"));
    KubeConnection c = Connection();
    if (!trusted_ca.empty()) c.ca_pem = trusted_ca;
    Result<std::optional<json>> r =
        KubeClusterReader(c).Get({ObjectKind::kNamespace, "team-a", "team-a"});
    EXPECT_FALSE(r.ok());
    return r.status().message();
  };
  const std::string wrong_name = get_from(MakePki("a", -60, 3600, "DNS:example.com"), "");
  EXPECT_NE(wrong_name.find("not valid for \"127.0.0.1\""), std::string::npos) << wrong_name;
  EXPECT_NE(wrong_name.find("tls-server-name"), std::string::npos) << wrong_name;
  const std::string unknown_ca = get_from(MakePki("b"), MakePki("other").ca_pem);
  EXPECT_NE(unknown_ca.find("unable to get local issuer certificate"), std::string::npos)
      << unknown_ca;
  EXPECT_NE(unknown_ca.find("certificate-authority-data of cluster local"), std::string::npos)
      << unknown_ca;
  const std::string expired = get_from(MakePki("c", -7200, -3600), "");
  EXPECT_NE(expired.find("certificate has expired"), std::string::npos) << expired;
}

// The configured CA is the only one trusted. With a certificate store, cpp-httplib added the
// system's default CAs to it (in the image, Debian's public CAs), so any of them could vouch
// for an API server's name, as kubectl never lets them. SSL_CERT_FILE points OpenSSL's default
// at the server's own CA here: trusted through it, the server was accepted.
TEST_F(KubeClientTest, OnlyTheConfiguredCaIsTrusted) {
  const testing::Pki server = MakePki("server");
  api_.reset();
  api_ = std::make_unique<FakeApiServer>(dir_, server);
  WriteFileAtomic(dir_ / "kubeconfig", api_->Kubeconfig("token"));
  WriteFileAtomic(dir_ / "system-ca.pem", server.ca_pem);
  ::setenv("SSL_CERT_FILE", (dir_ / "system-ca.pem").c_str(), 1);
  KubeConnection c = Connection();
  c.ca_pem = MakePki("configured").ca_pem;
  Result<std::optional<json>> r =
      KubeClusterReader(c).Get({ObjectKind::kNamespace, "team-a", "team-a"});
  ::unsetenv("SSL_CERT_FILE");
  ASSERT_FALSE(r.ok()) << "accepted through the system's CAs";
  EXPECT_NE(r.status().message().find("unable to get local issuer certificate"),
            std::string::npos)
      << r.status().message();
}

// No API server object comes near 8 MiB (etcd keeps 1.5 MiB at most): a 100 MB answer was read
// whole, kept in the cache and copied at every hit.
TEST_F(KubeClientTest, AnswersOverTheCapAreRefusedUnread) {
  KubeConnection c = Connection();
  c.timeout = std::chrono::seconds(20);
  KubeClusterReader kube(c);
  json big = {{"kind", "LLMInferenceService"},
              {"metadata", {{"name", "llama"}, {"namespace", "team-a"},
                            {"annotations", {{"padding", std::string(9 << 20, 'x')}}}}}};
  api_->Put(kLlmisvcPath, big);
  Result<std::optional<json>> sized = kube.Get({ObjectKind::kLLMInferenceService, "team-a", "llama"});
  ASSERT_FALSE(sized.ok());
  EXPECT_NE(sized.status().message().find("the answer for LLMInferenceService team-a/llama is too "
                                          "large (Content-Length 94"),
            std::string::npos)
      << sized.status().message();
  // Without a length, reading stops at the cap, long before the budget.
  api_->PutEndless("/api/v1/namespaces/team-a", std::string(64 << 10, ' '),
                   std::chrono::milliseconds(1));
  const auto start = std::chrono::steady_clock::now();
  Result<std::optional<json>> endless = kube.Get({ObjectKind::kNamespace, "team-a", "team-a"});
  ASSERT_FALSE(endless.ok());
  EXPECT_NE(endless.status().message().find("too large (more than 8388608 bytes"),
            std::string::npos)
      << endless.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A 200 that is not the object asked for was used as it: `null`, a list or `{}` as "exists,
// without a spec" (the namespace default skipped), another namespace's object as this one.
TEST_F(KubeClientTest, AnswerMustBeTheObjectAskedFor) {
  KubeClusterReader kube(Connection());
  const std::string url = "https://127.0.0.1:" + std::to_string(api_->port()) + kLlmisvcPath;
  const ObjectRef llama{ObjectKind::kLLMInferenceService, "team-a", "llama"};
  const json other = {{"kind", "LLMInferenceService"},
                      {"metadata", {{"name", "other"}, {"namespace", "team-z"}}},
                      {"spec", {{"kvCacheOffloading", {{"cpu", "9Gi"}}}}}};
  json elsewhere = other;
  elsewhere["metadata"]["name"] = "llama";
  json bad_spec = elsewhere;
  bad_spec["metadata"]["namespace"] = "team-a";
  bad_spec["spec"] = 5;
  for (const auto& [answer, why] : std::vector<std::pair<json, std::string>>{
           {nullptr, "a JSON null, not an object"},
           {json::array(), "a JSON array, not an object"},
           {"x", "a JSON string, not an object"},
           {json::object(), "it has no metadata"},
           {other, "its metadata.name is \"other\""},
           {elsewhere, "its metadata.namespace is \"team-z\""},
           {bad_spec, "its spec is a JSON number, not an object"}}) {
    api_->Put(kLlmisvcPath, answer);
    Result<std::optional<json>> r = kube.Get(llama);
    ASSERT_FALSE(r.ok()) << answer.dump();
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(r.status().message(),
              "GET " + url + ": the answer is not LLMInferenceService team-a/llama: " + why);
  }
  api_->PutRaw(kLlmisvcPath, R"({"kind": "LLMInferenceService", "spec": )");
  Result<std::optional<json>> cut = kube.Get(llama);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("the answer to GET " + url + " is not valid JSON"),
            std::string::npos)
      << cut.status().message();
}

// A reader the cache sits in front of, answering by name: "slow" takes until its caller's
// deadline and fails as an unreached API server does, "gone" does not exist, the rest exist.
class ScriptedReader final : public ClusterReader {
 public:
  Result<std::optional<json>> GetBefore(const ObjectRef& ref, Deadline deadline) override {
    calls_.fetch_add(1);
    if (ref.name == "slow" && slow_.load()) {
      std::this_thread::sleep_until(deadline);
      return Status::Unavailable("GET " + ref.name + ": no answer within the lookup budget");
    }
    if (ref.name.starts_with("gone")) return std::optional<json>();
    return std::optional<json>(json{{"metadata", {{"name", ref.name}}}});
  }
  bool Authoritative() const override { return true; }
  std::atomic<int> calls_{0};
  std::atomic<bool> slow_{true};
};

TEST(CachingReaderTest, NamesThatDoNotExistOrAnswersTooOldToServeAreForgotten) {
  // Every name ever asked about stayed in the cache: a loop of dry-run pods, each naming an
  // LLMInferenceService or PVC that does not exist, grew the webhook until it was killed.
  ScriptedReader inner;
  CachingClusterReader cache(&inner, std::chrono::seconds(10), std::chrono::minutes(5), nullptr);
  for (int i = 0; i < 5000; ++i) {
    const ObjectRef ref{ObjectKind::kPersistentVolumeClaim, "team-a", "gone-" + std::to_string(i)};
    Result<std::optional<json>> r = cache.Get(ref);
    ASSERT_TRUE(r.ok() && !r->has_value());
  }
  EXPECT_EQ(cache.entries(), 0u);
  // Answers that exist are kept while they may be served (here: not at all, a stale TTL of
  // 0), so the map is swept as it grows.
  CachingClusterReader unkept(&inner, std::chrono::seconds(0), std::chrono::seconds(0), nullptr);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(unkept.Get({ObjectKind::kPersistentVolumeClaim, "team-a", "kv-" + std::to_string(i)})
                    .ok());
  }
  EXPECT_LE(unkept.entries(), 1024u);
}

TEST(CachingReaderTest, AWaiterWithTimeLeftAsksAgainWhenTheCallItWaitedForRanOut) {
  // Two admissions want one object from a slow API server: the first, with 100 ms of its
  // budget left, makes the call; the second, with 5 s, waits for it. It got the first's
  // "no answer within the lookup budget" and was denied with seconds to spare.
  ScriptedReader inner;
  CachingClusterReader cache(&inner, std::chrono::seconds(10), std::chrono::minutes(5), nullptr);
  const ObjectRef ref{ObjectKind::kLLMInferenceService, "team-a", "slow"};
  const auto start = std::chrono::steady_clock::now();
  std::future<bool> first = std::async(std::launch::async, [&] {
    return cache.GetBefore(ref, start + std::chrono::milliseconds(100)).ok();
  });
  while (inner.calls_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::future<Result<std::optional<json>>> second = std::async(std::launch::async, [&] {
    return cache.GetBefore(ref, start + std::chrono::seconds(5));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  inner.slow_ = false;  // the API server answers again, in time for the second admission
  EXPECT_FALSE(first.get());
  const Result<std::optional<json>> got = second.get();
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(got->has_value());
  EXPECT_EQ(inner.calls_.load(), 2);
}

}  // namespace
}  // namespace kvoffload::webhook
