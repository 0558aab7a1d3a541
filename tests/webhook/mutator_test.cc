// Mutate() as two steps: every denial of a pod is found in one pass (so a user fixes them all in
// one round), and a pod with none gets the patch. The golden tests cover the patches.
#include "webhook/mutator.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "webhook/admission.h"
#include "webhook/cluster_reader.h"
#include "webhook/resolver.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

// A pod annotated with `spec`, container "main" with a 16Gi memory limit.
json Pod(const json& spec) {
  return {{"metadata", {{"annotations", {{kAnnotationConfig, spec.dump()}}}}},
          {"spec",
           {{"containers",
             {{{"name", "main"}, {"resources", {{"limits", {{"memory", "16Gi"}}}}}}}}}}};
}

MutationInput Input(json pod, std::map<std::string, PvcInfo> pvcs = {}) {
  Result<Resolution> res = Resolve(pod, "team-a", nullptr);
  EXPECT_TRUE(res.ok()) << res.status().message();
  EXPECT_TRUE(res->spec.has_value());
  res->pvcs = std::move(pvcs);
  return MutationInput(std::move(pod), "team-a", std::move(*res),
                       {Mode::kVllmNative, /*agent_image=*/""});
}

json EmptyDirSpec(const std::string& size) {
  return {{"cpu", "1Gi"}, {"secondary", {{{"fileSystem", {{"emptyDir", {{"size", size}}}}}}}}};
}

const json kRefSpec = {
    {"cpu", "20Gi"},
    {"secondary", {{{"fileSystem", {{"pvc", {{"ref", {{"name", "nope"}}}}}}}}}}};

TEST(MutateTest, NamesEveryIndependentProblem) {
  // Two unrelated mistakes: the PVC does not exist, and the CPU tier does not fit in memory.
  Mutation m = Mutate(Input(Pod(kRefSpec), {{"nope", PvcInfo{}}}));
  ASSERT_FALSE(m.allowed);
  ASSERT_EQ(m.denials.size(), 2u) << m.denial;
  EXPECT_NE(m.denial.find("PersistentVolumeClaim \"nope\" not found"), std::string::npos)
      << m.denial;
  EXPECT_NE(m.denial.find("does not fit in container \"main\"'s memory limit 16Gi"),
            std::string::npos)
      << m.denial;
  EXPECT_EQ(m.denial.rfind("2 problems: (1) kvCacheOffloading.secondary[0]", 0), 0u) << m.denial;
  EXPECT_NE(m.denial.find("; (2) kvCacheOffloading.cpu: 20Gi"), std::string::npos) << m.denial;
  EXPECT_TRUE(m.patch.empty());
  EXPECT_TRUE(m.warnings.empty());
}

TEST(MutateTest, TheWebhookNamesBothProblems) {
  // The same pod as an AdmissionReview, the PVC looked up in a cluster that lacks it.
  const std::vector<json> no_objects;
  StaticClusterReader cluster(no_objects, "team-a", /*authoritative=*/true);
  const AdmissionHandler handler(AdmissionOptions{}, &cluster);
  const json review = {{"apiVersion", "admission.k8s.io/v1"},
                       {"kind", "AdmissionReview"},
                       {"request",
                        {{"uid", "u1"},
                         {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                         {"operation", "CREATE"},
                         {"namespace", "team-a"},
                         {"object", Pod(kRefSpec)}}}};
  const json response = json::parse(handler.Handle("application/json", review.dump()).body);
  ASSERT_EQ(response["response"]["allowed"], false) << response.dump();
  const std::string message = response["response"]["status"]["message"];
  EXPECT_NE(message.find("PersistentVolumeClaim \"nope\" not found"), std::string::npos)
      << message;
  EXPECT_NE(message.find("does not fit in container \"main\"'s memory limit 16Gi"),
            std::string::npos)
      << message;
}

TEST(MutateTest, OneProblemKeepsItsOwnWords) {
  json pod = Pod(kRefSpec);
  pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "64Gi";
  Mutation m = Mutate(Input(pod, {{"nope", PvcInfo{}}}));
  ASSERT_FALSE(m.allowed);
  ASSERT_EQ(m.denials.size(), 1u);
  EXPECT_EQ(m.denial, m.denials[0]);
  EXPECT_EQ(m.denial.rfind("kvCacheOffloading.secondary[0].fileSystem.pvc.ref.name:", 0), 0u)
      << m.denial;
}

TEST(MutateTest, ModeAndContainerProblemsTogether) {
  // An unknown mode and an unknown container: neither hides the other, and checks that need
  // the container (memory) are not guessed at.
  json pod = Pod(kRefSpec);
  pod["metadata"]["annotations"][kAnnotationMode] = "turbo";
  pod["metadata"]["annotations"][kAnnotationContainer] = "sidecar";
  Mutation m = Mutate(Input(pod, {{"nope", PvcInfo{}}}));
  ASSERT_FALSE(m.allowed);
  ASSERT_EQ(m.denials.size(), 3u) << m.denial;
  EXPECT_NE(m.denials[0].find("\"turbo\" is not a mode"), std::string::npos) << m.denials[0];
  EXPECT_NE(m.denials[1].find("names container \"sidecar\""), std::string::npos) << m.denials[1];
  EXPECT_NE(m.denials[2].find("\"nope\" not found"), std::string::npos) << m.denials[2];
}

TEST(MutateTest, AgentModeWithoutImageAndTooSmallEphemeralLimit) {
  json pod = Pod(EmptyDirSpec("100Gi"));
  pod["metadata"]["annotations"][kAnnotationMode] = "agent";
  pod["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "10Gi";
  Mutation m = Mutate(Input(pod));
  ASSERT_EQ(m.denials.size(), 2u) << m.denial;
  EXPECT_NE(m.denials[0].find("--agent-image"), std::string::npos) << m.denials[0];
  // Without a request, the request is the limit, as the API server sets it for a Pod before
  // any webhook sees it: an offline manifest or a template is judged as its pods will be.
  EXPECT_NE(m.denials[1].find("ephemeral-storage limit 10Gi is below the request 110Gi after "
                              "adding 100Gi of emptyDir tiers (without a request, a pod's "
                              "request is its limit)"),
            std::string::npos)
      << m.denials[1];
  // With a request of its own, that is what the tiers are added to.
  pod["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "110Gi";
  pod["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = "10Gi";
  pod["metadata"]["annotations"][kAnnotationMode] = "vllm-native";
  m = Mutate(Input(pod));
  EXPECT_TRUE(m.allowed) << m.denial;
}

// What the pod has under our names or at our paths. As KServe renders a tier (our volume, at
// our path, of the tier's kind, "/" at the end or not) it is kept; anything else was kept as
// well and went wrong later: a second mount at one path (which the API server refuses), a tier
// directory with no volume behind it, a hostPath where an emptyDir was asked for.
TEST(MutateTest, MountsAndVolumesUnderOurNamesMustBeOurs) {
  json rendered = Pod(EmptyDirSpec("5Gi"));
  rendered["spec"]["volumes"] = {{{"name", "kv-cache-secondary-0"}, {"emptyDir", {{"sizeLimit", "5Gi"}}}}};
  rendered["spec"]["containers"][0]["volumeMounts"] = {
      {{"name", "kv-cache-secondary-0"}, {"mountPath", "/mnt/kv-cache-0/"}}};
  Mutation kept = Mutate(Input(rendered));
  EXPECT_TRUE(kept.allowed) << kept.denial;
  for (const json& op : json::parse(kept.patch)) {
    EXPECT_FALSE(op.dump().find("kv-cache-secondary-0") != std::string::npos) << op.dump();
  }

  json clash = Pod(EmptyDirSpec("5Gi"));
  clash["metadata"]["annotations"][kAnnotationMode] = "agent";
  clash["spec"]["volumes"] = {{{"name", "kv-cache-secondary-0"}, {"hostPath", {{"path", "/data"}}}},
                              {{"name", "models"}, {"emptyDir", json::object()}}};
  clash["spec"]["containers"][0]["volumeMounts"] = {
      {{"name", "kv-cache-secondary-0"}, {"mountPath", "/data"}},
      {{"name", "models"}, {"mountPath", "/opt/kvoffload/"}}};
  MutationInput in = Input(clash);
  in.options.agent_image = "kv-offload/offload-agent:test";
  Mutation m = Mutate(in);
  ASSERT_FALSE(m.allowed);
  ASSERT_EQ(m.denials.size(), 3u) << m.denial;
  EXPECT_EQ(m.denials[0].rfind("container \"main\" mounts volume \"kv-cache-secondary-0\" at "
                               "/data, but that name is disk tier 0's, mounted at /mnt/kv-cache-0:"
                               " rename the volume, or mount it at /mnt/kv-cache-0",
                               0),
            0u)
      << m.denials[0];
  EXPECT_EQ(m.denials[1].rfind("volume \"kv-cache-secondary-0\" is already in the pod, but not as "
                               "disk tier 0 (emptyDir) would have it: rename the pod's volume",
                               0),
            0u)
      << m.denials[1];
  EXPECT_EQ(m.denials[2].rfind("container \"main\" mounts volume \"models\" at /opt/kvoffload/, "
                               "where the agent's library is mounted; mount it elsewhere",
                               0),
            0u)
      << m.denials[2];
}

TEST(MutateTest, CheckedPlanBuildsThePatch) {
  json pod = Pod(EmptyDirSpec("5Gi"));
  const MutationInput in = Input(pod);
  CheckedMutation checked = CheckMutation(in);
  ASSERT_TRUE(checked.denials.empty());
  EXPECT_EQ(checked.plan.container_name, "main");
  ASSERT_TRUE(checked.plan.ephemeral_request.has_value());
  EXPECT_EQ(checked.plan.ephemeral_request->ToString(), "5Gi");
  std::vector<std::string> warnings = checked.plan.warnings;
  const std::string text = BuildPatch(in, checked.plan, &warnings);
  EXPECT_EQ(text, Mutate(in).patch);
  const json patch = json::parse(text);
  const json patched = pod.patch(patch);
  EXPECT_EQ(patched["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"], "5Gi");

  // Admitting the result again: the plan says nothing is left to do.
  const CheckedMutation again = CheckMutation(Input(patched));
  EXPECT_TRUE(again.denials.empty());
  EXPECT_TRUE(again.plan.already_injected);
}

// The install step's text is kept per thread for the last image: a webhook given another image
// (tests, a second handler in one process) must never hand out the first one.
TEST(MutateTest, TheInstallStepNamesTheImageOfEachCall) {
  for (const std::string image : {"registry/agent:1", "registry/agent:2", "registry/agent:1"}) {
    json pod = Pod(EmptyDirSpec("1Gi"));
    Result<Resolution> res = Resolve(pod, "team-a", nullptr);
    ASSERT_TRUE(res.ok()) << res.status().message();
    const Mutation m =
        Mutate(MutationInput(std::move(pod), "team-a", std::move(*res), {Mode::kAgent, image}));
    ASSERT_TRUE(m.allowed) << m.denial;
    const json patched = Pod(EmptyDirSpec("1Gi")).patch(json::parse(m.patch));
    ASSERT_EQ(patched["spec"]["initContainers"].size(), 1u);
    EXPECT_EQ(patched["spec"]["initContainers"][0]["image"], image);
  }
}

// For what the mutator keeps per thread: `answer` of each input, in turn on this thread (two
// rounds), equals its answer on a thread that saw no other input, and neighbouring inputs differ
// (else the test could not tell one cached answer from another).
template <typename Input, typename Answer>
void ExpectEachAsOnAFreshThread(const std::vector<Input>& inputs, Answer answer) {
  std::vector<std::string> on_fresh_threads;
  for (const Input& in : inputs) {
    std::string a;
    std::thread([&] { a = answer(in); }).join();
    on_fresh_threads.push_back(a);
  }
  for (size_t i = 1; i < inputs.size(); ++i) {
    EXPECT_NE(on_fresh_threads[i], on_fresh_threads[i - 1]) << "inputs " << i - 1 << " and " << i;
  }
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_EQ(answer(inputs[i]), on_fresh_threads[i]) << "input " << i << ", round " << round;
    }
  }
}

// KServe's router scheduler carries the service's part-of and name labels but runs the llm-d
// scheduler, whose flag parser refuses --kv-transfer-config: only workload pods get the flag.
TEST(MutateTest, OnlyKServeWorkloadPodsAreTakenToRunVllm) {
  auto pod_with = [](const std::string& component) {
    json pod = Pod(EmptyDirSpec("1Gi"));
    pod["metadata"]["labels"] = {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                 {"app.kubernetes.io/name", "llama"},
                                 {"app.kubernetes.io/component", component}};
    pod["spec"]["containers"][0]["args"] = {"--config-text", "x"};
    return pod;
  };
  const Mutation scheduler = Mutate(Input(pod_with("llminferenceservice-router-scheduler")));
  ASSERT_TRUE(scheduler.allowed) << scheduler.denial;
  EXPECT_EQ(scheduler.patch.find("--kv-transfer-config"), std::string::npos) << scheduler.patch;
  EXPECT_NE(scheduler.patch.find(R"(\"vllmFlagReason\":\"not-vllm\")"), std::string::npos)
      << scheduler.patch;
  const Mutation workload = Mutate(Input(pod_with("llminferenceservice-workload")));
  ASSERT_TRUE(workload.allowed) << workload.denial;
  EXPECT_NE(workload.patch.find("--kv-transfer-config"), std::string::npos) << workload.patch;
}

// The launch plan is kept per thread for the last launch: pods whose launches differ in any
// part the plan reads (args, the script, VLLM_ADDITIONAL_ARGS or how it is set) must each get
// their own, as a thread that saw none of the others gives them.
TEST(MutateTest, EachLaunchGetsItsOwnPlan) {
  auto vllm_pod = [](const json& container_fields) {
    json pod = Pod(EmptyDirSpec("1Gi"));
    pod["metadata"]["annotations"][kAnnotationVllm] = "true";
    pod["spec"]["containers"][0].update(container_fields);
    return pod;
  };
  const std::string script = "exec vllm serve /models \"$@\"";
  const std::vector<json> pods = {
      vllm_pod({{"command", {"vllm", "serve"}}, {"args", {"/m", R"(--kv-transfer-config={})"}}}),
      vllm_pod({{"command", {"vllm", "serve"}}, {"args", {"/m"}}}),
      vllm_pod({{"command", {"/bin/bash", "-c", script}}}),
      vllm_pod({{"command", {"/bin/bash", "-c", script, "--"}}}),
      vllm_pod({{"command", {"/bin/bash", "-c", "exec vllm serve /m $VLLM_ADDITIONAL_ARGS"}},
                {"env", {{{"name", "VLLM_ADDITIONAL_ARGS"}, {"value", ""}}}}}),
      vllm_pod({{"command", {"/bin/bash", "-c", "exec vllm serve /m $VLLM_ADDITIONAL_ARGS"}},
                {"env", {{{"name", "VLLM_ADDITIONAL_ARGS"},
                          {"valueFrom", {{"configMapKeyRef", {{"name", "c"}, {"key", "k"}}}}}}}}}),
  };
  auto mutate = [](const json& pod) {
    const Mutation m = Mutate(Input(pod));
    return m.patch + "|" + JoinDenials(m.warnings);
  };
  ExpectEachAsOnAFreshThread(pods, mutate);
}

// A repeated env name reaches the container with its last value (the kubelet keeps the last),
// so the last VLLM_ADDITIONAL_ARGS is the one that decides whether vLLM already has a flag.
TEST(MutateTest, TheLastVllmAdditionalArgsIsTheOneVllmReads) {
  auto pod_with = [](const std::vector<std::string>& values) {
    json pod = Pod(EmptyDirSpec("1Gi"));
    pod["metadata"]["annotations"][kAnnotationVllm] = "true";
    json& c = pod["spec"]["containers"][0];
    c["command"] = {"/bin/bash", "-c", "exec vllm serve /m $VLLM_ADDITIONAL_ARGS"};
    for (const std::string& v : values) {
      c["env"].push_back({{"name", "VLLM_ADDITIONAL_ARGS"}, {"value", v}});
    }
    return pod;
  };
  const std::string theirs = R"(--kv-transfer-config {"kv_connector":"Theirs"})";
  const Mutation last_is_theirs = Mutate(Input(pod_with({"--max-model-len 4096", theirs})));
  EXPECT_NE(JoinDenials(last_is_theirs.warnings).find("--kv-transfer-config in VLLM_ADDITIONAL_ARGS"),
            std::string::npos)
      << JoinDenials(last_is_theirs.warnings);
  const Mutation first_is_theirs = Mutate(Input(pod_with({theirs, "--max-model-len 4096"})));
  EXPECT_EQ(JoinDenials(first_is_theirs.warnings).find("--kv-transfer-config in VLLM_ADDITIONAL_ARGS"),
            std::string::npos)
      << JoinDenials(first_is_theirs.warnings);
  EXPECT_NE(first_is_theirs.patch.find("OffloadingConnector"), std::string::npos)
      << first_is_theirs.patch;
}

// A P/D connector of the user's gets ours after it where the order is known (args,
// VLLM_ADDITIONAL_ARGS), one MultiConnector with theirs first; written in the launch script
// itself it is kept alone, and the warning gives the way to run both. An offloading connector
// of theirs (LMCache) is kept alone wherever it is: ours beside it would keep every block twice.
TEST(MutateTest, APdConnectorOfTheUsersGetsOursBesideItWhereTheOrderIsKnown) {
  auto pod_with = [](const std::string& script, const std::string& connector) {
    json pod = Pod(EmptyDirSpec("1Gi"));
    pod["metadata"]["annotations"][kAnnotationVllm] = "true";
    json& c = pod["spec"]["containers"][0];
    // The JSON has no blanks: an unquoted expansion splits it at none.
    const std::string value =
        "{\"kv_connector\":\"" + connector + "\",\"kv_role\":\"kv_producer\"}";
    c["command"] = {"/bin/bash", "-c",
                    script == "script"
                        ? "exec vllm serve /m --kv-transfer-config '" + value + "' \"$@\""
                        : "exec vllm serve /m $VLLM_ADDITIONAL_ARGS \"$@\""};
    if (script == "env") {
      c["env"] = {{{"name", "VLLM_ADDITIONAL_ARGS"}, {"value", "--kv-transfer-config " + value}}};
    }
    return pod;
  };
  const Mutation in_env = Mutate(Input(pod_with("env", "NixlConnector")));
  EXPECT_NE(in_env.patch.find("MultiConnector"), std::string::npos) << in_env.patch;
  EXPECT_NE(in_env.patch.find("\\\"vllmFlagBeside\\\":\\\"NixlConnector\\\""), std::string::npos)
      << in_env.patch;
  const Mutation in_script = Mutate(Input(pod_with("script", "NixlConnector")));
  EXPECT_EQ(in_script.patch.find("MultiConnector"), std::string::npos) << in_script.patch;
  EXPECT_NE(JoinDenials(in_script.warnings)
                .find("so vLLM runs NixlConnector and no offloading: to run both, pass one "
                      "MultiConnector with yours first and ours second"),
            std::string::npos)
      << JoinDenials(in_script.warnings);
  // Given key by key, theirs is laid by vLLM over any whole flag (checked with vLLM 0.32's
  // parser): ours after it would come out as theirs. Kept alone.
  json dotted = Pod(EmptyDirSpec("1Gi"));
  dotted["metadata"]["annotations"][kAnnotationVllm] = "true";
  dotted["spec"]["containers"][0]["command"] = {"vllm", "serve", "/m"};
  dotted["spec"]["containers"][0]["args"] = {"--kv-transfer-config.kv_connector=NixlConnector",
                                             "--kv-transfer-config.kv_role=kv_producer"};
  const Mutation by_key = Mutate(Input(dotted));
  EXPECT_EQ(by_key.patch.find("MultiConnector"), std::string::npos) << by_key.patch;
  EXPECT_NE(JoinDenials(by_key.warnings).find("kept it instead of ours"), std::string::npos)
      << JoinDenials(by_key.warnings);
  const Mutation lmcache = Mutate(Input(pod_with("env", "LMCacheConnectorV1")));
  EXPECT_EQ(lmcache.patch.find("MultiConnector"), std::string::npos) << lmcache.patch;
  EXPECT_NE(JoinDenials(lmcache.warnings).find("so vLLM runs LMCacheConnectorV1 and not "
                                               "kv-offload's tiers"),
            std::string::npos)
      << JoinDenials(lmcache.warnings);
}

// Of a repeated env name the container gets the last entry, so that is the one each of ours is
// read from and replaced in; names like ours (as long, the same first byte) are left alone.
TEST(MutateTest, TheEnvEntryTheContainerGetsIsTheOneReadAndReplaced) {
  json pod = Pod(EmptyDirSpec("1Gi"));
  pod["metadata"]["annotations"][kAnnotationVllm] = "true";
  json& c = pod["spec"]["containers"][0];
  c["command"] = {"/bin/bash", "-c", "exec vllm serve /m $VLLM_ADDITIONAL_ARGS"};
  const std::string long_name(70, 'K');
  const std::vector<std::pair<std::string, std::string>> env = {
      {"KVOFFLOAD_TIERZ", "x"},      {"PYTHONPATH", "/first"},
      {"KVOFFLOAD_TIERS", "stale"},  {"PYTHONPATH", "/app"},
      {long_name, "kept"},           {"KVOFFLOAD_TIERS", "stale too"},
      {"VLLM_ADDITIONAL_ARGS", "--first"}, {"VLLM_ADDITIONAL_ARGS", "--max-model-len 4096"}};
  for (const auto& [name, value] : env) c["env"].push_back({{"name", name}, {"value", value}});
  Result<Resolution> res = Resolve(pod, "team-a", nullptr);
  ASSERT_TRUE(res.ok()) << res.status().message();
  const Mutation m = Mutate(
      MutationInput(pod, "team-a", std::move(*res), {Mode::kAgent, "registry/agent:1"}));
  ASSERT_TRUE(m.allowed) << m.denial;
  const json patched = pod.patch(json::parse(m.patch))["spec"]["containers"][0]["env"];
  // What the kubelet gives the container: the last value of each name.
  std::map<std::string, std::string> seen;
  std::map<std::string, int> count;
  for (const json& e : patched) {
    seen[e["name"].get<std::string>()] = e["value"].get<std::string>();
    ++count[e["name"].get<std::string>()];
  }
  EXPECT_EQ(seen["PYTHONPATH"], "/opt/kvoffload/python:/app");
  EXPECT_EQ(seen["KVOFFLOAD_TIERS"].rfind("[{", 0), 0u) << seen["KVOFFLOAD_TIERS"];
  EXPECT_EQ(seen["VLLM_ADDITIONAL_ARGS"].rfind("--max-model-len 4096 --kv-transfer-config", 0),
            0u)
      << seen["VLLM_ADDITIONAL_ARGS"];
  EXPECT_EQ(seen["KVOFFLOAD_TIERZ"], "x");
  EXPECT_EQ(seen[long_name], "kept");
  EXPECT_EQ(count["KVOFFLOAD_TIERS"], 2);  // replaced, not added again
  EXPECT_EQ(count["PYTHONPATH"], 2);
  EXPECT_EQ(count["VLLM_ADDITIONAL_ARGS"], 2);
  // The entries before the last of each name are the pod's own, unchanged.
  for (size_t i : {0u, 1u, 2u, 4u, 6u}) {
    EXPECT_EQ(patched[i]["value"], env[i].second) << "entry " << i;
  }
}

// vLLM's multiproc executor kills its workers VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 s by
// default) after it shuts down, which cut the agent's write-back in them to 4 s: agent mode
// sets it to the write-back's 10 s and a margin, unless the container sets it itself.
TEST(MutateTest, AgentModeGivesVllmWorkersTheWriteBacksTime) {
  auto worker_timeout = [](const json& env_before) {
    json pod = Pod(EmptyDirSpec("1Gi"));
    if (!env_before.is_null()) pod["spec"]["containers"][0]["env"] = env_before;
    Result<Resolution> res = Resolve(pod, "team-a", nullptr);
    EXPECT_TRUE(res.ok()) << res.status().message();
    const Mutation m = Mutate(
        MutationInput(pod, "team-a", std::move(*res), {Mode::kAgent, "registry/agent:1"}));
    EXPECT_TRUE(m.allowed) << m.denial;
    const json patched = pod.patch(json::parse(m.patch));
    std::vector<json> entries;
    for (const json& e : patched["spec"]["containers"][0]["env"]) {
      if (e["name"] == std::string(kWorkerShutdownEnv)) entries.push_back(e);
    }
    return entries;
  };
  std::vector<json> got = worker_timeout(nullptr);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["value"], "11");
  got = worker_timeout(json::array({{{"name", kWorkerShutdownEnv}, {"value", "30"}}}));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["value"], "30");
  const json from_map = {{"name", kWorkerShutdownEnv},
                         {"valueFrom", {{"configMapKeyRef", {{"name", "vllm"}, {"key", "t"}}}}}};
  got = worker_timeout(json::array({from_map}));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], from_map);
}

// What a mutation derives from the spec alone (tiers, hash, the vLLM flag) is kept per thread
// for the last spec: inputs that differ in any part it reads must each get their own, as a
// thread that saw none of the others gives them. A quantity written another way is another
// spec to the hash ("1Gi" and "1073741824" print differently in the canonical form).
TEST(MutateTest, EachSpecGetsItsOwnTiersAndHash) {
  const json ref_spec = {
      {"cpu", "1Gi"},
      {"secondary", {{{"fileSystem", {{"pvc", {{"ref", {{"name", "shared"}}}}}}}}}}};
  struct Case {
    json spec;
    std::map<std::string, PvcInfo> pvcs;
    Mode mode;
    std::string image;
    std::string container;
  };
  const PvcInfo rwo{true, {"ReadWriteOnce"},
                    Quantity::FromInt(1 << 30, Quantity::Format::kBinarySI)};
  PvcInfo rwx = rwo;
  rwx.access_modes = {"ReadWriteMany"};
  PvcInfo bigger = rwo;
  bigger.capacity = Quantity::FromInt(int64_t{2} << 30, Quantity::Format::kBinarySI);
  PvcInfo decimal = rwo;
  decimal.capacity = Quantity::FromInt(1 << 30, Quantity::Format::kDecimalSI);
  json decimal_cpu = EmptyDirSpec("1Gi");
  decimal_cpu["cpu"] = "1073741824";
  json arc = EmptyDirSpec("1Gi");
  arc["evictionPolicy"] = "arc";
  const std::vector<Case> cases = {
      {EmptyDirSpec("1Gi"), {}, Mode::kVllmNative, "", "main"},
      {decimal_cpu, {}, Mode::kVllmNative, "", "main"},
      {arc, {}, Mode::kVllmNative, "", "main"},
      {EmptyDirSpec("2Gi"), {}, Mode::kVllmNative, "", "main"},
      {EmptyDirSpec("2Gi"), {}, Mode::kAgent, "registry/agent:1", "main"},
      {EmptyDirSpec("2Gi"), {}, Mode::kAgent, "registry/agent:2", "main"},
      {EmptyDirSpec("2Gi"), {}, Mode::kAgent, "registry/agent:2", "worker"},
      {ref_spec, {{"shared", rwo}}, Mode::kVllmNative, "", "main"},
      {ref_spec, {{"shared", rwx}}, Mode::kVllmNative, "", "main"},
      {ref_spec, {{"shared", bigger}}, Mode::kVllmNative, "", "main"},
      {ref_spec, {{"shared", decimal}}, Mode::kVllmNative, "", "main"},
  };
  auto mutate = [](const Case& c) {
    json pod = Pod(c.spec);
    pod["spec"]["containers"][0]["name"] = c.container;
    Result<Resolution> res = Resolve(pod, "team-a", nullptr);
    EXPECT_TRUE(res.ok()) << res.status().message();
    res->pvcs = c.pvcs;
    const Mutation m = Mutate(MutationInput(pod, "team-a", std::move(*res), {c.mode, c.image}));
    return m.patch + "|" + JoinDenials(m.warnings) + "|" + m.denial;
  };
  ExpectEachAsOnAFreshThread(cases, mutate);
}

TEST(MutateTest, JoinDenials) {
  EXPECT_EQ(JoinDenials({"a; b"}), "a; b");
  EXPECT_EQ(JoinDenials({"a; b", "c"}), "2 problems: (1) a; b; (2) c");
}

TEST(MutateTest, OptOutAndOptIn) {
  auto opted_out = [](const json& pod) { return OptedOut(JsonDocument::Of(pod).Root()); };
  auto opted_in = [](const json& pod) { return OptedIn(JsonDocument::Of(pod).Root()); };
  json pod = {{"metadata", {{"labels", {{kLabelInject, "false"}}}}}};
  EXPECT_TRUE(opted_out(pod));
  EXPECT_FALSE(opted_in(pod));
  pod["metadata"]["labels"][kLabelInject] = "true";
  EXPECT_FALSE(opted_out(pod));
  EXPECT_TRUE(opted_in(pod));
  EXPECT_FALSE(opted_out(json::object()));
  EXPECT_FALSE(opted_out({{"metadata", {{"labels", "not an object"}}}}));
}

}  // namespace
}  // namespace kvoffload::webhook

namespace kvoffload::webhook {
namespace {

// The config hash is compared with the one in a pod's status annotation on reinvocation and on
// re-apply, possibly written by an earlier release: the same config must keep its hash. Pinned
// to the value the release that introduced DumpJson computed through nlohmann's dump().
TEST(ConfigHashTest, StaysTheSameAcrossReleases) {
  SpecParse parsed = ParseSpec(json::parse(R"({"cpu": "8Gi", "evictionPolicy": "arc",
      "secondary": [{"fileSystem": {"emptyDir": {"size": "100Gi"}}},
                    {"fileSystem": {"pvc": {"ref": {"name": "shared-kv", "path": "m\"odel"}}}},
                    {"fileSystem": {"pvc": {"spec": {"accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "50Gi"}}}}}}]})"));
  ASSERT_TRUE(parsed.errors.empty()) << parsed.errors.front().message;
  const json tiers = TiersEnv(parsed.spec, {});
  EXPECT_EQ(ConfigHash(parsed.spec, Mode::kAgent, "main", tiers, "registry/agent:1.0"),
            "d85641b4556d298a");
  EXPECT_EQ(ConfigHash(parsed.spec, Mode::kVllmNative, "vllm", tiers, "registry/agent:1.0"),
            "9519f0fd696e714e");
}

}  // namespace
}  // namespace kvoffload::webhook
