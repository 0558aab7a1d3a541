// Apply-time checks: the same words as the pod webhook, every error with its field path, in
// every document; warnings for what is valid but likely wrong.
#include "webhook/validation.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "webhook/inject.h"
#include "webhook/resolver.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The seed's full example, as users copy it (examples/ in the repository).
std::string SeedExample() {
  const std::string text = ReadFile(KVOFFLOAD_EXAMPLES "/llminferenceservice.yaml");
  EXPECT_NE(text.find("kind: LLMInferenceService"), std::string::npos);
  return text;
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

bool Has(const std::vector<std::string>& lines, const std::string& needle) {
  for (const std::string& l : lines) {
    if (l.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::string All(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

ObjectReport One(const std::string& manifests) {
  Result<std::vector<ObjectReport>> reports = ValidateManifests(manifests, InjectOptions{});
  EXPECT_TRUE(reports.ok()) << reports.status().message();
  EXPECT_EQ(reports.ok() ? reports->size() : 0u, 1u);
  return reports.ok() && !reports->empty() ? reports->front() : ObjectReport{};
}

TEST(ValidationTest, SeedExampleIsValid) {
  const ObjectReport r = One(SeedExample());
  EXPECT_EQ(r.object, "LLMInferenceService default/qwen3");
  EXPECT_TRUE(r.checked);
  EXPECT_TRUE(r.errors.empty()) << All(r.errors);
  // Offline, the pre-existing PVC is not among the documents: said, not refused.
  EXPECT_TRUE(Has(r.warnings, "PVC my-kv-cache-pvc was not checked")) << All(r.warnings);
}

TEST(ValidationTest, BrokenSeedExampleReportsEveryErrorWithItsPath) {
  std::string bad = Replace(SeedExample(), "cpu: \"10Gi\"", "cpu: \"ten\"");
  bad = Replace(bad, "evictionPolicy: lru", "evictionPolicy: fifo");
  bad = Replace(bad, "size: \"100Gi\"", "size: \"100Gx\"");
  const ObjectReport r = One(bad);
  ASSERT_EQ(r.errors.size(), 3u) << All(r.errors);
  EXPECT_EQ(r.errors[0].rfind("spec.kvCacheOffloading.cpu: \"ten\" is not a valid quantity", 0), 0u)
      << r.errors[0];
  EXPECT_EQ(r.errors[1], "spec.kvCacheOffloading.evictionPolicy: \"fifo\" is not supported: use "
                         "one of arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo (agent mode) or arc, "
                         "lru (vllm-native mode); names are lowercase");
  EXPECT_EQ(r.errors[2].rfind("spec.kvCacheOffloading.secondary[0].fileSystem.emptyDir.size: "
                              "\"100Gx\" is not a valid quantity",
                              0),
            0u)
      << r.errors[2];
  // The admission denial: the pod denial's opening, then every error with its full path.
  EXPECT_EQ(r.denial.rfind("kvCacheOffloading from LLMInferenceService default/qwen3 is invalid: "
                           "spec.kvCacheOffloading.cpu: ",
                           0),
            0u)
      << r.denial;
  EXPECT_NE(r.denial.find("; spec.kvCacheOffloading.evictionPolicy: \"fifo\""), std::string::npos);
}

TEST(ValidationTest, WorkloadAndPrefillPathsOfBothApiVersions) {
  const ObjectReport r = One(R"(apiVersion: serving.kserve.io/v1alpha1
kind: LLMInferenceService
metadata: {name: pd, namespace: team-a}
spec:
  workload:
    kvCacheOffloading: {cpu: "0"}
  prefill:
    kvCacheOffloading:
      cpu: 1Gi
      secondary: [{fileSystem: {pvc: {ref: {name: Bad_Name}}}}]
    workload:
      kvCacheOffloading: {cpu: 1Gi, evictionPolicy: LRU}
)");
  EXPECT_EQ(r.errors.size(), 3u) << All(r.errors);
  EXPECT_TRUE(Has(r.errors, "spec.workload.kvCacheOffloading.cpu: must be greater than 0"));
  EXPECT_TRUE(Has(r.errors, "spec.prefill.kvCacheOffloading.secondary[0].fileSystem.pvc.ref.name: "
                            "\"Bad_Name\" is not a valid PVC name"));
  EXPECT_TRUE(Has(r.errors, "spec.prefill.workload.kvCacheOffloading.evictionPolicy: \"LRU\""));
}

// KServe renders the pods from the inlined spec.kvCacheOffloading; a CRD that keeps unknown
// fields can hold spec.workload.kvCacheOffloading beside it. The pods got the other one.
TEST(ValidationTest, BothPathsSetThePodsGetTheInlinedOneAndAWarning) {
  const ObjectReport r = One(R"(apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: both, namespace: team-a}
spec:
  template:
    containers: [{name: main, resources: {limits: {memory: 16Gi}}}]
  kvCacheOffloading: {cpu: 1Gi}
  workload:
    kvCacheOffloading: {cpu: 64Gi}
)");
  EXPECT_TRUE(r.errors.empty()) << All(r.errors);
  EXPECT_TRUE(Has(r.warnings, "spec.kvCacheOffloading and spec.workload.kvCacheOffloading "
                              "differ; the pods get the first"))
      << All(r.warnings);
}

// An LLMInferenceServiceConfig's kvCacheOffloading is checked where it is written, and a
// service that names it in spec.baseRefs is checked with what its pods get: the config's
// merged under its own (here a cpu of 64Gi from the config against the template's 16Gi).
TEST(ValidationTest, BaseRefsConfigsAreCheckedAndMergedUnderTheService) {
  Result<std::vector<ObjectReport>> reports = ValidateManifests(R"(apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceServiceConfig
metadata: {name: tiers, namespace: team-a}
spec:
  kvCacheOffloading: {cpu: 64Gi, evictionPolicy: fifo}
---
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceServiceConfig
metadata: {name: big-cpu, namespace: team-a}
spec:
  kvCacheOffloading: {cpu: 64Gi}
---
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: m, namespace: team-a}
spec:
  baseRefs: [{name: big-cpu}, {name: elsewhere}]
  template:
    containers: [{name: main, resources: {limits: {memory: 16Gi}}}]
---
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: partial, namespace: team-a}
spec:
  baseRefs: [{name: big-cpu}]
  kvCacheOffloading:
    secondary: [{fileSystem: {emptyDir: {size: 1Gi}}}]
---
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: nameless, namespace: team-a}
spec:
  baseRefs: [{name: big-cpu}, {}]
)",
                                                                InjectOptions{});
  ASSERT_TRUE(reports.ok()) << reports.status().message();
  ASSERT_EQ(reports->size(), 5u);
  // The service's own kvCacheOffloading is written by KServe with its cpu, "0" where unset,
  // over the config's: a service that sets only tiers has no CPU tier, as in KServe.
  EXPECT_TRUE(Has((*reports)[3].errors, "with LLMInferenceServiceConfig team-a/big-cpu: "
                                        "kvCacheOffloading.cpu: must be greater than 0"))
      << (*reports)[3].object
      << All((*reports)[3].errors);
  EXPECT_TRUE(Has((*reports)[4].errors, "spec.baseRefs[1] of LLMInferenceService "
                                        "team-a/nameless names no LLMInferenceServiceConfig"))
      << All((*reports)[4].errors);
  const ObjectReport& config = (*reports)[0];
  EXPECT_EQ(config.object, "LLMInferenceServiceConfig team-a/tiers");
  EXPECT_TRUE(Has(config.errors, "spec.kvCacheOffloading.evictionPolicy: \"fifo\""))
      << All(config.errors);
  EXPECT_TRUE((*reports)[1].errors.empty()) << All((*reports)[1].errors);
  // A part of a spec, in a config or in a service that names configs, is no error for the
  // cpu it leaves to the others (the real API server refused such a config before).
  Result<std::vector<ObjectReport>> part = ValidateManifests(R"(apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceServiceConfig
metadata: {name: policy, namespace: team-a}
spec:
  kvCacheOffloading: {evictionPolicy: arc}
)",
                                                             InjectOptions{});
  ASSERT_TRUE(part.ok());
  ASSERT_EQ(part->size(), 1u);
  EXPECT_TRUE((*part)[0].errors.empty()) << All((*part)[0].errors);
  const ObjectReport& svc = (*reports)[2];
  ASSERT_EQ(svc.errors.size(), 1u) << All(svc.errors);
  EXPECT_EQ(svc.errors[0].rfind("spec.template: kvCacheOffloading.cpu: 64Gi does not fit in "
                                "container \"main\"'s memory limit 16Gi",
                                0),
            0u)
      << svc.errors[0];
  EXPECT_NE(svc.denial.find("LLMInferenceService team-a/m with LLMInferenceServiceConfig "
                            "team-a/big-cpu"),
            std::string::npos)
      << svc.denial;
  // Offline only the files given are known: a config not among them is said, not refused.
  EXPECT_TRUE(Has(svc.warnings, "spec.baseRefs: LLMInferenceServiceConfig elsewhere is not "
                                "among the manifests given"))
      << All(svc.warnings);
}

// A spec.baseRefs name that is no object name ("../../x" would be looked up as a path) is the
// same error at apply time as at admission, with no cluster to read (the /validate webhook
// without one) as with one.
TEST(ValidationTest, BaseRefsNameThatIsNoObjectNameIsAnError) {
  const std::string svc = R"(apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: m, namespace: team-a}
spec:
  baseRefs: [{name: "../../../team-b/llminferenceserviceconfigs/x"}]
  kvCacheOffloading: {cpu: 1Gi}
)";
  const std::string expected =
      "spec.baseRefs[0].name of LLMInferenceService team-a/m is "
      "\"../../../team-b/llminferenceserviceconfigs/x\", which is no LLMInferenceServiceConfig "
      "name: write the config's metadata.name";
  const ObjectReport offline = One(svc);
  EXPECT_TRUE(Has(offline.errors, expected)) << All(offline.errors);
  const json object = {
      {"apiVersion", "serving.kserve.io/v1alpha2"},
      {"kind", "LLMInferenceService"},
      {"metadata", {{"name", "m"}, {"namespace", "team-a"}}},
      {"spec",
       {{"baseRefs", {{{"name", "../../../team-b/llminferenceserviceconfigs/x"}}}},
        {"kvCacheOffloading", {{"cpu", "1Gi"}}}}}};
  Result<ObjectReport> no_cluster = ValidateObject(object, "team-a", {}, nullptr);
  ASSERT_TRUE(no_cluster.ok()) << no_cluster.status().message();
  EXPECT_TRUE(Has(no_cluster->errors, expected)) << All(no_cluster->errors);
}

TEST(ValidationTest, TemplateMemoryLimitDeniesAndWarnsLikeThePod) {
  const std::string svc = R"(apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: m, namespace: team-a}
spec:
  template:
    containers: [{name: main, resources: {limits: {memory: 64Gi}}}]
  kvCacheOffloading: {cpu: CPU}
)";
  const ObjectReport denied = One(Replace(svc, "CPU", "64Gi"));
  ASSERT_EQ(denied.errors.size(), 1u) << All(denied.errors);
  EXPECT_EQ(denied.errors[0].rfind("spec.template: kvCacheOffloading.cpu: 64Gi does not fit in "
                                   "container \"main\"'s memory limit 64Gi",
                                   0),
            0u)
      << denied.errors[0];
  EXPECT_NE(denied.denial.find("(kvCacheOffloading from LLMInferenceService team-a/m)"),
            std::string::npos);
  const ObjectReport warned = One(Replace(svc, "CPU", "60Gi"));
  EXPECT_TRUE(warned.errors.empty()) << All(warned.errors);
  EXPECT_TRUE(Has(warned.warnings, "kvCacheOffloading.cpu 60Gi is over 80% of container main's "
                                   "memory limit 64Gi"))
      << All(warned.warnings);
}

json Pvc(const std::string& name, const std::string& mode) {
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolumeClaim"},
          {"metadata", {{"name", name}, {"namespace", "team-a"}}},
          {"spec", {{"accessModes", {mode}}, {"resources", {{"requests", {{"storage", "1Ti"}}}}}}}};
}

ValidationOptions AgentMode() {
  ValidationOptions options;
  options.default_mode = Mode::kAgent;
  options.agent_image = "kv-offload/offload-agent:test";
  return options;
}

const ValidationOptions kAgent = AgentMode();

json SharedPvcService(int replicas) {
  json svc = json::parse(R"({"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
    "metadata": {"name": "s", "namespace": "team-a"},
    "spec": {"kvCacheOffloading": {"cpu": "1Gi",
             "secondary": [{"fileSystem": {"pvc": {"ref": {"name": "kv"}}}}]}}})");
  svc["spec"]["replicas"] = replicas;
  return svc;
}

TEST(ValidationTest, ReadWriteOncePvcSharedByReplicasIsAWarning) {
  StaticClusterReader cluster({Pvc("kv", "ReadWriteOnce")}, "team-a", /*authoritative=*/true);
  Result<ObjectReport> r = ValidateObject(SharedPvcService(3), "team-a", {}, &cluster);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->errors.empty()) << All(r->errors);
  EXPECT_TRUE(Has(r->warnings, "PVC kv is not ReadWriteMany but the workload has 3 replicas"))
      << All(r->warnings);
  StaticClusterReader rwx({Pvc("kv", "ReadWriteMany")}, "team-a", /*authoritative=*/true);
  Result<ObjectReport> shared = ValidateObject(SharedPvcService(3), "team-a", kAgent, &rwx);
  ASSERT_TRUE(shared.ok());
  EXPECT_TRUE(shared->warnings.empty()) << All(shared->warnings);
}

// A multi-node replica (a worker template: a LeaderWorkerSet group) is a leader and workers on
// as many nodes, all mounting the service's claims: one replica of a group of 2 was not warned
// about, while two single-node replicas were.
TEST(ValidationTest, AMultiNodeGroupSharingAReadWriteOncePvcIsAWarning) {
  StaticClusterReader cluster({Pvc("kv", "ReadWriteOnce")}, "team-a", /*authoritative=*/true);
  json svc = SharedPvcService(1);
  svc["spec"]["worker"] = {{"containers", json::array({{{"name", "main"}}})}};
  svc["spec"]["parallelism"] = {{"data", 4}, {"dataLocal", 2}};
  Result<ObjectReport> r = ValidateObject(svc, "team-a", {}, &cluster);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(Has(r->warnings, "PVC kv is not ReadWriteMany but the workload has 2 replicas "
                               "(pods: a multi-node replica counts its leader and workers)"))
      << All(r->warnings);
  svc["spec"]["replicas"] = 3;
  svc["spec"]["parallelism"] = {{"data", 16}, {"dataLocal", 2}};
  r = ValidateObject(svc, "team-a", {}, &cluster);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(Has(r->warnings, "the workload has 24 replicas")) << All(r->warnings);
  svc["spec"].erase("worker");  // single node: 3 pods
  r = ValidateObject(svc, "team-a", {}, &cluster);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(Has(r->warnings, "the workload has 3 replicas")) << All(r->warnings);
}

// KServe's CRD types evictionPolicy as an enum of lru and arc: validate passed an
// LLMInferenceService with an agent-only policy, which the API server then refused. The
// agent's other policies go in a pod annotation or the namespace default, which no CRD types.
TEST(ValidationTest, AnLLMInferenceServiceTakesOnlyThePoliciesItsCrdDoes) {
  for (const char* api : {"serving.kserve.io/v1alpha2", "serving.kserve.io/v1alpha1"}) {
    json svc = SharedPvcService(1);
    svc["apiVersion"] = api;
    svc["spec"]["kvCacheOffloading"] = {{"cpu", "1Gi"}, {"evictionPolicy", "lirs"}};
    Result<ObjectReport> r = ValidateObject(svc, "team-a", kAgent, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(Has(r->errors, "spec.kvCacheOffloading.evictionPolicy: \"lirs\" is not a value "
                               "KServe's LLMInferenceService CRD takes (its enum: lru, arc)"))
        << All(r->errors);
    svc["spec"]["kvCacheOffloading"]["evictionPolicy"] = "arc";
    r = ValidateObject(svc, "team-a", kAgent, nullptr);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->errors.empty()) << All(r->errors);
  }
  // The same policy in the namespace default is the agent's to take.
  json ns = {{"apiVersion", "v1"}, {"kind", "Namespace"},
             {"metadata", {{"name", "team-a"},
                           {"annotations", {{kAnnotationDefaultConfig,
                                             R"({"cpu":"1Gi","evictionPolicy":"lirs"})"}}}}}};
  Result<ObjectReport> r = ValidateObject(ns, "team-a", kAgent, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->errors.empty()) << All(r->errors);
}

// KServe's CRD (config/crd/full/llmisvc) has kvCacheOffloading in v1alpha2 only, at spec and
// spec.prefill, with no workload field and no unknown fields kept: validate passed KServe's
// own sample (spec.workload.kvCacheOffloading) and any v1alpha1 spec, which the API server
// drops without a word, so no pod got the spec.
TEST(ValidationTest, ASpecKServesCrdDropsIsAWarning) {
  json svc = SharedPvcService(1);
  svc["spec"] = {{"workload", {{"kvCacheOffloading", {{"cpu", "1Gi"}}}}}};
  Result<ObjectReport> r = ValidateObject(svc, "team-a", kAgent, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(Has(r->warnings, "spec.workload.kvCacheOffloading: KServe's LLMInferenceService has "
                               "no spec.workload field, so the API server drops it"))
      << All(r->warnings);
  svc["apiVersion"] = "serving.kserve.io/v1alpha1";
  svc["spec"] = {{"kvCacheOffloading", {{"cpu", "1Gi"}}}};
  r = ValidateObject(svc, "team-a", kAgent, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(Has(r->warnings, "spec.kvCacheOffloading: KServe's v1alpha1 LLMInferenceService "
                               "has no kvCacheOffloading"))
      << All(r->warnings);
  svc["apiVersion"] = "serving.kserve.io/v1alpha2";
  r = ValidateObject(svc, "team-a", kAgent, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->warnings.empty()) << All(r->warnings);
}

TEST(ValidationTest, VllmNativePvcRefWarnsThatItOutlivesTheModel) {
  // vLLM names its file tier's directory after the model's path, /mnt/models for every model
  // KServe serves; agent mode scopes by the weights.
  StaticClusterReader rwx({Pvc("kv", "ReadWriteMany")}, "team-a", /*authoritative=*/true);
  Result<ObjectReport> native = ValidateObject(SharedPvcService(1), "team-a", {}, &rwx);
  ASSERT_TRUE(native.ok());
  EXPECT_EQ(native->warnings,
            std::vector<std::string>{
                "secondary[0] pvc.ref kv: vllm-native names its files by the model's path "
                "(/mnt/models in KServe's pods), not its weights, so after a model change this "
                "PVC serves the old model's KV; give each model its own pvc.ref.path, or use "
                "agent mode, which scopes by the weights"});
  Result<ObjectReport> agent = ValidateObject(SharedPvcService(1), "team-a", kAgent, &rwx);
  ASSERT_TRUE(agent.ok());
  EXPECT_TRUE(agent->warnings.empty()) << All(agent->warnings);
}

TEST(ValidationTest, MissingPvcIsAWarningAtApplyTime) {
  // The pod webhook denies pods while the PVC is missing; an apply may create it right after.
  StaticClusterReader empty({}, "team-a", /*authoritative=*/true);
  Result<ObjectReport> r = ValidateObject(SharedPvcService(1), "team-a", kAgent, &empty);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->errors.empty()) << All(r->errors);
  EXPECT_EQ(r->warnings,
            std::vector<std::string>{
                "PVC kv not found in namespace team-a: its pods are denied until it exists"});
}

class DownReader : public ClusterReader {
 public:
  Result<std::optional<json>> GetBefore(const ObjectRef&, Deadline) override {
    return Status::Unavailable("connection refused");
  }
  bool Authoritative() const override { return true; }
};

TEST(ValidationTest, LookupFailureIsUnavailableNotADenial) {
  DownReader down;
  Result<ObjectReport> r = ValidateObject(SharedPvcService(1), "team-a", {}, &down);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("PersistentVolumeClaim team-a/kv"), std::string::npos);
}

TEST(ValidationTest, NamespaceDefaultSaysWhatThePodDenialSays) {
  const json ns = json::parse(R"({"apiVersion": "v1", "kind": "Namespace",
    "metadata": {"name": "team-b",
                 "annotations": {"kvoffload.io/default-config": "{\"cpu\":\"ten\",\"x\":1}"}}})");
  Result<ObjectReport> r = ValidateObject(ns, "team-b", {}, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->object, "Namespace team-b");
  ASSERT_EQ(r->errors.size(), 2u) << All(r->errors);
  EXPECT_TRUE(Has(r->errors, "metadata.annotations[kvoffload.io/default-config]: "
                             "kvCacheOffloading.x: unknown field"));
  EXPECT_TRUE(Has(r->errors, "metadata.annotations[kvoffload.io/default-config]: "
                             "kvCacheOffloading.cpu: \"ten\" is not a valid quantity"));
  // A pod in that namespace is denied with exactly the same message.
  StaticClusterReader cluster({ns}, "team-b", /*authoritative=*/true);
  const json pod = {{"metadata", {{"name", "p"}}}, {"spec", {{"containers", {{{"name", "main"}}}}}}};
  Result<Resolution> at_pod_time = Resolve(pod, "team-b", &cluster);
  ASSERT_FALSE(at_pod_time.ok());
  EXPECT_EQ(r->denial, at_pod_time.status().message());

  json not_json = ns;
  not_json["metadata"]["annotations"][kAnnotationDefaultConfig] = "cpu: 1Gi";
  Result<ObjectReport> bad_json = ValidateObject(not_json, "team-b", {}, nullptr);
  ASSERT_TRUE(bad_json.ok());
  ASSERT_EQ(bad_json->errors.size(), 1u);
  EXPECT_NE(bad_json->errors[0].find("it must hold the kvCacheOffloading spec as JSON"),
            std::string::npos)
      << bad_json->errors[0];

  json plain = ns;
  plain["metadata"].erase("annotations");
  Result<ObjectReport> unchecked = ValidateObject(plain, "team-b", {}, nullptr);
  ASSERT_TRUE(unchecked.ok());
  EXPECT_FALSE(unchecked->checked);
}

json Deployment(const json& template_labels, const std::string& config) {
  json d = json::parse(R"({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "d", "namespace": "team-a"},
    "spec": {"replicas": 2, "template": {"metadata": {},
             "spec": {"containers": [{"name": "main", "image": "vllm"}]}}}})");
  d["spec"]["template"]["metadata"]["labels"] = template_labels;
  d["spec"]["template"]["metadata"]["annotations"] = {{kAnnotationConfig, config}};
  return d;
}

TEST(ValidationTest, WorkloadTemplateGetsThePodDenial) {
  const std::string config = R"({"cpu":"1Gi","evictionPolicy":"fifo"})";
  Result<ObjectReport> r = ValidateObject(Deployment(json::object(), config), "team-a", {}, nullptr);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->errors.size(), 1u);
  const json pod = Deployment(json::object(), config)["spec"]["template"];
  Result<Resolution> at_pod_time = Resolve(pod, "team-a", nullptr);
  ASSERT_FALSE(at_pod_time.ok());
  EXPECT_EQ(r->errors[0], "spec.template: " + at_pod_time.status().message());
  EXPECT_EQ(r->denial, r->errors[0]);
}

// A workload without its pod template is refused by inject (InjectTest) and by the API server:
// validate passed it, "0 object(s) ... checked", exit 0.
TEST(ValidationTest, WorkloadWithoutATemplateIsInvalidAsInjectSays) {
  const std::string manifest =
      "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: team}\n"
      "spec: {replicas: 1}\n";
  Result<std::vector<ObjectReport>> reports = ValidateManifests(manifest, InjectOptions{});
  ASSERT_TRUE(reports.ok()) << reports.status().message();
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_EQ(reports->front().object, "Deployment team/d");
  EXPECT_EQ(reports->front().errors, std::vector<std::string>{"spec.template: no pod template here"});
  Result<InjectResult> injected = InjectManifests(manifest, InjectOptions{});
  ASSERT_FALSE(injected.ok());
  EXPECT_EQ(injected.status().message(),
            reports->front().object + ": " + reports->front().errors.front());
}

TEST(ValidationTest, OnlyTemplatesWhosePodsWouldBeInjected) {
  const std::string bad = R"({"cpu":"ten"})";
  const json opted_out = Deployment({{kLabelInject, "false"}}, bad);
  Result<ObjectReport> r = ValidateObject(opted_out, "team-a", {}, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->checked);
  EXPECT_TRUE(r->errors.empty());

  ValidationOptions needs_label;
  needs_label.pods_need_label = true;
  r = ValidateObject(Deployment(json::object(), bad), "team-a", needs_label, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->checked);
  r = ValidateObject(Deployment({{kLabelInject, "true"}}, bad), "team-a", needs_label, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->errors.size(), 1u);
}

TEST(ValidationTest, MultiDocumentFileReportsEveryDocument) {
  const std::string stream = Replace(SeedExample(), "cpu: \"10Gi\"", "cpu: \"ten\"") + R"(---
apiVersion: v1
kind: Namespace
metadata:
  name: team-c
  annotations: {kvoffload.io/default-config: '{"cpu":"1Gi","evictionPolicy":"fifo"}'}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: not-ours}
data: {a: b}
---
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: big, namespace: team-c}
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec: {containers: [{name: main, image: x, resources: {limits: {memory: 2Gi}}}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: fine, namespace: team-c}
spec:
  template:
    metadata: {annotations: {kvoffload.io/config: '{"cpu":"1Gi"}'}}
    spec: {containers: [{name: main, image: x}]}
)";
  Result<std::vector<ObjectReport>> reports = ValidateManifests(stream, InjectOptions{});
  ASSERT_TRUE(reports.ok()) << reports.status().message();
  ASSERT_EQ(reports->size(), 4u);  // the ConfigMap holds nothing of ours
  EXPECT_EQ((*reports)[0].object, "LLMInferenceService default/qwen3");
  EXPECT_TRUE(Has((*reports)[0].errors, "spec.kvCacheOffloading.cpu: \"ten\""));
  EXPECT_EQ((*reports)[1].object, "Namespace team-c");
  EXPECT_TRUE(Has((*reports)[1].errors, "kvCacheOffloading.evictionPolicy: \"fifo\""));
  // The LeaderWorkerSet's pods take team-c's default spec from the Namespace document above.
  EXPECT_EQ((*reports)[2].object, "LeaderWorkerSet team-c/big");
  EXPECT_TRUE(Has((*reports)[2].errors,
                  "spec.leaderWorkerTemplate.workerTemplate: kvCacheOffloading from namespace "
                  "team-c annotation kvoffload.io/default-config is invalid"))
      << All((*reports)[2].errors);
  EXPECT_EQ((*reports)[3].object, "Job team-c/fine");
  EXPECT_TRUE((*reports)[3].errors.empty()) << All((*reports)[3].errors);

  // inject refuses the same stream with every error of what it would inject, one line each,
  // not just the first.
  Result<InjectResult> injected = InjectManifests(stream, InjectOptions{});
  ASSERT_FALSE(injected.ok());
  const std::string message = injected.status().message();
  EXPECT_NE(message.find("LLMInferenceService default/qwen3: spec.kvCacheOffloading.cpu"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("\nNamespace team-c: metadata.annotations[kvoffload.io/default-config]"),
            std::string::npos)
      << message;
  // validate checks every spec given; inject only those a webhook would see. team-c has no
  // kvoffload.io/injection label and the LeaderWorkerSet's pods no inject label, so neither
  // webhook is called for them in a cluster, and inject leaves them as they are.
  EXPECT_EQ(message.find("LeaderWorkerSet team-c/big"), std::string::npos) << message;
}

}  // namespace
}  // namespace kvoffload::webhook
