#include "webhook/inject.h"

#include <gtest/gtest.h>

#include <string>

namespace kvoffload::webhook {
namespace {

using ojson = nlohmann::ordered_json;

constexpr char kStream[] = R"(apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: llama, namespace: team-a}
spec:
  kvCacheOffloading:
    cpu: 10Gi
    secondary:
      - fileSystem: {emptyDir: {size: 100Gi}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: untouched, namespace: team-a}
data: {port: "8000", enabled: "yes", ratio: "1e3", empty: ""}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: llama-kserve, namespace: team-a}
spec:
  replicas: 2
  template:
    metadata:
      labels: {app.kubernetes.io/name: llama, app.kubernetes.io/part-of: llminferenceservice}
    spec:
      containers:
        - name: main
          image: vllm/vllm-openai:v0.22.0
          args: [--port, "8000"]
)";

std::vector<ojson> Docs(const std::string& yaml) {
  Result<std::vector<ojson>> docs = ParseYamlDocuments(yaml);
  EXPECT_TRUE(docs.ok()) << docs.status().message();
  return docs.ok() ? *docs : std::vector<ojson>{};
}

// Every mapping of `in` appears in `out` with its keys in the same order; keys the patch adds
// come after them. `where` is the JSON pointer shown when it fails.
void ExpectSameKeyOrder(const ojson& in, const ojson& out, const std::string& where) {
  if (in.is_object()) {
    ASSERT_TRUE(out.is_object()) << where;
    std::vector<std::string> in_keys;
    for (const auto& [key, value] : in.items()) in_keys.push_back(key);
    std::vector<std::string> out_keys;
    for (const auto& [key, value] : out.items()) out_keys.push_back(key);
    ASSERT_GE(out_keys.size(), in_keys.size()) << where;
    const std::string all = ojson(out_keys).dump();
    out_keys.resize(in_keys.size());
    EXPECT_EQ(out_keys, in_keys) << where << ": output keys " << all;
    for (const std::string& key : in_keys) ExpectSameKeyOrder(in[key], out[key], where + "/" + key);
  } else if (in.is_array()) {
    ASSERT_TRUE(out.is_array()) << where;
    for (size_t i = 0; i < in.size() && i < out.size(); ++i) {
      ExpectSameKeyOrder(in[i], out[i], where + "/" + std::to_string(i));
    }
  }
}

// Keys in an order no sort would give, at every depth: the document, the workload spec, the
// pod template, a container, its env entries and resources, and a document inject leaves alone.
constexpr char kUnsortedStream[] = R"(metadata: {namespace: team-a, name: settings}
kind: ConfigMap
apiVersion: v1
data: {zeta: "1", alpha: "2", mid: "3"}
---
spec:
  template:
    spec:
      containers:
        - image: vllm/vllm-openai:v0.22.0
          name: main
          env:
            - value: "1"
              name: ZZ_FIRST
            - valueFrom: {fieldRef: {fieldPath: status.podIP}}
              name: AA_SECOND
          resources: {requests: {memory: 8Gi, cpu: "2"}}
          args: [--port, "8000"]
      terminationGracePeriodSeconds: 30
    metadata:
      labels: {zone: b, app: llama}
      annotations: {kvoffload.io/config: '{"cpu":"1Gi"}', team: x}
  selector: {matchLabels: {zone: b, app: llama}}
  replicas: 1
metadata: {namespace: team-a, name: llama}
kind: Deployment
apiVersion: apps/v1
---
spec:
  volumes: [{name: scratch, emptyDir: {}}]
  containers: [{name: main, image: x, volumeMounts: [{name: scratch, mountPath: /s}]}]
metadata:
  name: p
  annotations: {kvoffload.io/config: '{"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"}}}]}'}
kind: Pod
apiVersion: v1
)";

// The input's key order survives inject in every mapping, for YAML and for JSON input, and a
// second inject of the output is a no-op.
TEST(InjectTest, KeepsTheKeyOrderOfEveryMapping) {
  const std::vector<ojson> in = Docs(kUnsortedStream);
  ASSERT_EQ(in.size(), 3u);
  Result<InjectResult> out = InjectManifests(kUnsortedStream, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::vector<ojson> docs = Docs(out->output);
  ASSERT_EQ(docs.size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    ExpectSameKeyOrder(in[i], docs[i], "doc" + std::to_string(i));
  }
  // The workloads were patched (an order check on unpatched output would prove little).
  EXPECT_GT(docs[1]["spec"]["template"]["spec"]["containers"][0]["env"].size(), 2u);
  EXPECT_EQ(docs[2]["spec"]["volumes"].size(), 2u);
  EXPECT_TRUE(docs[2]["metadata"]["annotations"].contains("kvoffload.io/status"));
  Result<InjectResult> again = InjectManifests(out->output, InjectOptions{});
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->output, out->output);

  // The same documents as a JSON array come back as JSON in the same order.
  const std::string json_in = ojson(in).dump();
  Result<InjectResult> json_out = InjectManifests(json_in, InjectOptions{});
  ASSERT_TRUE(json_out.ok()) << json_out.status().message();
  const ojson json_docs = ojson::parse(json_out->output);
  ASSERT_EQ(json_docs.size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    ExpectSameKeyOrder(in[i], json_docs[i], "json" + std::to_string(i));
  }
  Result<InjectResult> json_again = InjectManifests(json_out->output, InjectOptions{});
  ASSERT_TRUE(json_again.ok()) << json_again.status().message();
  EXPECT_EQ(json_again->output, json_out->output);
}

// Found by fuzzing: yaml-cpp 0.7's LoadAll spins forever (allocating) on a flow collection
// followed by a comma; the input must be refused, promptly.
TEST(InjectTest, FlowCollectionFollowedByACommaIsRefusedNotAHang) {
  for (const char* text : {"{s: {}},", "[a, [b]],", "{s: []},\n", "[[]],"}) {
    SCOPED_TRACE(text);
    Result<std::vector<ojson>> docs = ParseYamlDocuments(text);
    ASSERT_FALSE(docs.ok());
    EXPECT_NE(docs.status().message().find("not valid YAML"), std::string::npos)
        << docs.status().message();
    EXPECT_FALSE(InjectManifests(text, InjectOptions{}).ok());
  }
  // Also found by fuzzing: bytes that are not UTF-8 made a later dump() throw and terminate.
  const std::string latin1 = "kind: Namespace\nmetadata:\n  name: caf\xe9\n";
  Result<std::vector<ojson>> docs = ParseYamlDocuments(latin1);
  ASSERT_FALSE(docs.ok());
  EXPECT_NE(docs.status().message().find("UTF-8"), std::string::npos);
  EXPECT_FALSE(InjectManifests(latin1, InjectOptions{}).ok());
  // NULs made yaml-cpp decode the input as UTF-32 into bytes that are not UTF-8.
  const std::string nuls("\0\0\0 pre\0ne ", 11);
  EXPECT_FALSE(ParseYamlDocuments(nuls).ok());
  EXPECT_FALSE(InjectManifests(nuls, InjectOptions{}).ok());
  // And fields of the wrong type (kind: a map) made ordered_json::value() throw: such a
  // document is not a workload, so it passes through unchanged.
  Result<InjectResult> odd = InjectManifests("apiVersion: v1\nkind: {a: b}\nmetadata: {name: {x: 1}, namespace: [1]}\n", InjectOptions{});
  ASSERT_TRUE(odd.ok()) << odd.status().message();
  EXPECT_EQ(Docs(odd->output)[0]["kind"]["a"], "b");
  // Several real documents, empty ones included, still parse.
  EXPECT_EQ(Docs("---\n---\na: 1\n---\nb: 2\n").size(), 2u);
}

TEST(InjectTest, InjectsWorkloadsFromTheSameStreamAndKeepsTheRest) {
  Result<InjectResult> out = InjectManifests(kStream, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  std::vector<ojson> docs = Docs(out->output);
  ASSERT_EQ(docs.size(), 3u);
  // Strings that look like numbers or booleans stay strings.
  EXPECT_EQ(docs[1]["data"]["port"], "8000");
  EXPECT_EQ(docs[1]["data"]["enabled"], "yes");
  EXPECT_EQ(docs[1]["data"]["ratio"], "1e3");
  EXPECT_EQ(docs[1]["data"]["empty"], "");
  EXPECT_EQ(docs[2]["spec"]["replicas"], 2);
  const ojson& tmpl = docs[2]["spec"]["template"];
  EXPECT_EQ(tmpl["spec"]["volumes"][0]["name"], "kv-cache-secondary-0");
  EXPECT_EQ(tmpl["spec"]["containers"][0]["args"][1], "8000");
  EXPECT_EQ(tmpl["spec"]["containers"][0]["args"].size(), 3u);  // + --kv-transfer-config
  EXPECT_TRUE(tmpl["metadata"]["annotations"].contains("kvoffload.io/status"));
  // Injecting the output again changes nothing.
  Result<InjectResult> again = InjectManifests(out->output, InjectOptions{});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->output, out->output);
}

// Offline, the LLMInferenceServiceConfigs a service names in spec.baseRefs come from the same
// files, looked for in the service's namespace, then in KServe's (--kserve-namespace).
TEST(InjectTest, BaseRefsConfigsFromTheSameFiles) {
  const std::string stream = R"(apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceServiceConfig
metadata: {name: kv-tiers, namespace: platform}
spec:
  kvCacheOffloading:
    cpu: 8Gi
    secondary: [{fileSystem: {emptyDir: {size: 100Gi}}}]
---
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: llama, namespace: team-a}
spec:
  baseRefs: [{name: kv-tiers}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: llama-kserve, namespace: team-a}
spec:
  template:
    metadata:
      labels: {app.kubernetes.io/part-of: llminferenceservice, app.kubernetes.io/name: llama}
    spec:
      containers: [{name: main, image: vllm}]
)";
  InjectOptions options;
  options.kserve_namespace = "platform";
  Result<InjectResult> out = InjectManifests(stream, options);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::vector<ojson> docs = Docs(out->output);
  ASSERT_EQ(docs.size(), 3u);
  const ojson& tmpl = docs[2]["spec"]["template"];
  EXPECT_EQ(tmpl["spec"]["volumes"][0]["emptyDir"]["sizeLimit"], "100Gi");
  EXPECT_NE(tmpl["metadata"]["annotations"]["kvoffload.io/status"].get<std::string>().find(
                "LLMInferenceService team-a/llama with LLMInferenceServiceConfig platform/kv-tiers"),
            std::string::npos);
  // In the default KServe namespace the config is not found: nothing to inject, as before.
  Result<InjectResult> elsewhere = InjectManifests(stream, InjectOptions{});
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status().message();
  const std::vector<ojson> plain = Docs(elsewhere->output);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_FALSE(plain[2]["spec"]["template"]["metadata"].contains("annotations"));
}

// Plain scalars are typed as kubectl's YAML reader (Go's yaml.v2, YAML 1.1) types them, and
// strings are written so that it reads them back as strings. Found by comparing with kubectl:
// defaultMode 0644 was written 644 (refused by the API server), an unquoted `yes` became the
// string "yes" for a boolean field, "1_000" and "0X1F" were written bare (numbers to kubectl).
TEST(InjectTest, ScalarsAreTypedAsKubectlTypesThem) {
  const std::string in = R"(apiVersion: v1
kind: ConfigMap
metadata:
  name: typed
  annotations: {a: "1_000", b: "0X1F", c: "0b1010", d: ".NaN", e: "0o17", f: "-0x1F", g: "+12",
                h: "08", i: "1_0.5", j: "-.Inf", k: "Off"}
data:
  octal: 0644
  octal12: 0o755
  under: 1_000
  hex: 0x1F
  bin: -0b11
  yes: yes
  off: off
  big: 12345678901234567890
  float8: 08
  date: 2024-01-01
)";
  const std::vector<ojson> docs = Docs(in);
  ASSERT_EQ(docs.size(), 1u);
  const ojson& data = docs[0]["data"];
  EXPECT_EQ(data["octal"], 420);
  EXPECT_EQ(data["octal12"], 493);
  EXPECT_EQ(data["under"], 1000);
  EXPECT_EQ(data["hex"], 31);
  EXPECT_EQ(data["bin"], -3);
  EXPECT_EQ(data["true"], true) << "the key yes is read as true, its value too";
  EXPECT_EQ(data["false"], false);
  EXPECT_EQ(data["big"], 12345678901234567890ULL);
  EXPECT_EQ(data["float8"], 8.0) << "not octal: Go reads it as a float";
  EXPECT_EQ(data["date"], "2024-01-01") << "yaml.v2 keeps timestamps as strings";
  // Every quoted string comes back a string, after a write and a read.
  Result<InjectResult> out = InjectManifests(in, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::vector<ojson> again = Docs(out->output);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0]["metadata"]["annotations"], docs[0]["metadata"]["annotations"])
      << out->output;
  EXPECT_EQ(again[0]["data"], data) << out->output;
  EXPECT_NE(out->output.find("octal: 420"), std::string::npos) << out->output;
  // NaN has no JSON form (kubectl refuses it): said, with its line.
  Result<InjectResult> nan = InjectManifests("kind: ConfigMap\ndata:\n  x: .nan\n", InjectOptions{});
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.status().message().find(".nan (line 3), which JSON cannot hold"), std::string::npos)
      << nan.status().message();
}

// A GitOps repository re-runs inject over its own output after a change of spec, mode or
// agent image: the result is what injecting the changed source gives. Our earlier parts were
// kept before: a grown emptyDir kept its old sizeLimit and request while KVOFFLOAD_TIERS took
// the new size (the agent filled past the limit, and the kubelet evicts for that), a removed
// tier kept its volume, a tier turned pvc.ref was refused over our own volume, a new agent
// image left the old one in the install step, and vllm-native kept the agent.
TEST(InjectTest, ReinjectingItsOwnOutputGivesWhatAFreshInjectionGives) {
  const std::string pod = R"(apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm, namespace: team-a}
spec:
  template:
    metadata:
      annotations: {kvoffload.io/config: 'SPEC', kvoffload.io/vllm: "true"MODE}
    spec:
      containers:
        - name: main
          image: vllm
          command: [vllm, serve]
          args: [/models/m]
          env: [{name: PYTHONPATH, value: /app}, {name: KVOFFLOAD_LOG_LEVEL, value: debug}]
          volumeMounts: [{name: kv-cache-secondary-7, mountPath: /data}]
          resources:
            requests: {ephemeral-storage: 1Gi}
            limits: {memory: 64Gi}
      volumes: [{name: kv-cache-secondary-7, hostPath: {path: /data}}]
)";
  auto source = [&](const std::string& spec, const std::string& mode) {
    std::string text = pod;
    text.replace(text.find("SPEC"), 4, spec);
    text.replace(text.find("MODE"), 4, mode.empty() ? "" : ", kvoffload.io/mode: " + mode);
    return text;
  };
  auto inject = [](const std::string& text, const std::string& image = "") {
    InjectOptions options;
    options.default_mode = Mode::kAgent;
    options.agent_image = image.empty() ? "kv-offload/offload-agent:0.1.0" : image;
    Result<InjectResult> out = InjectManifests(text, options);
    EXPECT_TRUE(out.ok()) << out.status().message();
    return out.ok() ? out->output : "";
  };
  // The template as JSON with its keys sorted: inject keeps the input's key order, so a
  // re-injected output may order what a fresh one adds differently.
  auto tmpl = [](const std::string& yaml) {
    const std::vector<ojson> docs = Docs(yaml);
    return docs.size() == 1 ? nlohmann::json::parse(docs[0]["spec"]["template"].dump())
                            : nlohmann::json();
  };
  const std::string first =
      inject(source(R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"10Gi"}}}]})", ""));
  const std::vector<std::pair<std::string, std::string>> changes = {
      {R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"20Gi"}}}]})", ""},
      {R"({"cpu":"1Gi"})", ""},
      {R"({"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv"}}}}]})", ""},
      {R"({"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"10Gi"}}}]})", "vllm-native"},
  };
  for (const auto& [spec, mode] : changes) {
    SCOPED_TRACE(spec + " " + mode);
    // The earlier output, its spec (and mode) edited as a user edits the repository.
    std::string edited = first;
    const size_t at = edited.find("kvoffload.io/config: ");
    ASSERT_NE(at, std::string::npos);
    const size_t end = edited.find('\n', at);
    edited.replace(at, end - at, "kvoffload.io/config: '" + spec + "'");
    if (!mode.empty()) {
      edited.replace(edited.find("kvoffload.io/vllm: "), 0, "kvoffload.io/mode: " + mode + "\n        ");
    }
    const std::string again = inject(edited);
    EXPECT_EQ(tmpl(again), tmpl(inject(source(spec, mode)))) << again;
    EXPECT_EQ(inject(again), again) << "a second run changes nothing";
  }
  // The user's own parts that look like ours stay: an env of the KVOFFLOAD_ prefix, a volume
  // under a tier's name past the tiers the status names.
  const nlohmann::json kept = tmpl(first);
  EXPECT_NE(kept.dump().find("KVOFFLOAD_LOG_LEVEL"), std::string::npos);
  for (const auto& [spec, mode] : changes) {
    std::string edited = first;
    const size_t at = edited.find("kvoffload.io/config: ");
    edited.replace(at, edited.find('\n', at) - at, "kvoffload.io/config: '" + spec + "'");
    const nlohmann::json again = tmpl(inject(edited));
    EXPECT_NE(again.dump().find("\"KVOFFLOAD_LOG_LEVEL\""), std::string::npos) << spec;
    EXPECT_NE(again.dump().find("\"hostPath\""), std::string::npos) << spec;
  }
  // Another agent image: the install step gets it.
  const std::string moved = inject(first, "registry.example.com/kv/offload-agent:0.2.0");
  EXPECT_EQ(tmpl(moved)["spec"]["initContainers"][0]["image"],
            "registry.example.com/kv/offload-agent:0.2.0");
}

// Inputs kubectl reads that were refused because they start as JSON does: YAML in flow style,
// a stream of JSON objects; and JSON behind a UTF-8 byte order mark came back as YAML.
TEST(InjectTest, FlowYamlJsonStreamsAndByteOrderMarks) {
  const std::string pod =
      R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"NAME","annotations":)"
      R"({"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}},"spec":{"containers":[{"name":"main"}]}})";
  auto named = [&](const std::string& name) {
    std::string text = pod;
    return text.replace(text.find("NAME"), 4, name);
  };
  Result<InjectResult> flow = InjectManifests(
      "{apiVersion: v1, kind: Pod, metadata: {name: flow, annotations: "
      "{kvoffload.io/config: '{\"cpu\":\"1Gi\"}'}}, spec: {containers: [{name: main}]}}\n",
      InjectOptions{});
  ASSERT_TRUE(flow.ok()) << flow.status().message();
  EXPECT_NE(flow->output.find("kvoffload.io/status"), std::string::npos) << flow->output;
  EXPECT_EQ(flow->output.rfind("apiVersion: v1", 0), 0u) << "YAML in, YAML out";

  Result<InjectResult> stream = InjectManifests(named("a") + "\n" + named("b"), InjectOptions{});
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  const size_t second = stream->output.find("\n{");
  ASSERT_NE(second, std::string::npos) << stream->output;
  const ojson a = ojson::parse(stream->output.substr(0, second));
  const ojson b = ojson::parse(stream->output.substr(second + 1));
  EXPECT_EQ(a["metadata"]["name"], "a");
  EXPECT_EQ(b["metadata"]["name"], "b");
  EXPECT_TRUE(b["metadata"]["annotations"].contains("kvoffload.io/status"));

  Result<InjectResult> bom = InjectManifests("\xEF\xBB\xBF" + named("bom"), InjectOptions{});
  ASSERT_TRUE(bom.ok()) << bom.status().message();
  EXPECT_EQ(bom->output.rfind("{", 0), 0u) << "JSON in, JSON out: " << bom->output;
}

// Offline, the webhooks' selection where the input says it: a pod in kube-system, in a
// namespace labelled injection=disabled (even one that asks), or unlabelled in a namespace
// without the label was injected, which the cluster never does.
TEST(InjectTest, NamespacesInTheInputSelectAsTheWebhooksDo) {
  const std::string pod = R"(---
apiVersion: v1
kind: Pod
metadata:
  name: NAME
  namespace: NS
  labels: LABELS
  annotations: {kvoffload.io/config: '{"cpu":"1Gi"}'}
spec: {containers: [{name: main}]}
)";
  auto make = [&](const std::string& name, const std::string& ns, const std::string& labels) {
    std::string text = pod;
    text.replace(text.find("NAME"), 4, name);
    text.replace(text.find("NS"), 2, ns);
    return text.replace(text.find("LABELS"), 6, labels);
  };
  const std::string in =
      "apiVersion: v1\nkind: Namespace\nmetadata: {name: out, labels: {kvoffload.io/injection: "
      "disabled}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: plain}\n---\n"
      "apiVersion: v1\nkind: Namespace\nmetadata: {name: on, labels: {kvoffload.io/injection: "
      "enabled}}\n" +
      make("asks-in-out", "out", "{kvoffload.io/inject: 'true'}") +
      make("system", "kube-system", "{}") + make("unlabelled-in-plain", "plain", "{}") +
      make("asks-in-plain", "plain", "{kvoffload.io/inject: 'true'}") +
      make("in-on", "on", "{}") + make("unknown-namespace", "elsewhere", "{}");
  Result<InjectResult> out = InjectManifests(in, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  std::vector<std::string> injected;
  for (const ojson& doc : Docs(out->output)) {
    if (doc["kind"] == "Pod" && doc["metadata"]["annotations"].contains("kvoffload.io/status")) {
      injected.push_back(doc["metadata"]["name"]);
    }
  }
  EXPECT_EQ(injected,
            (std::vector<std::string>{"asks-in-plain", "in-on", "unknown-namespace"}));

  // Nor is a spec checked where no webhook is called: one bad spec in kube-system or in a
  // namespace labelled disabled failed the whole stream, though neither webhook sees it.
  std::string bad = in + make("bad-in-system", "kube-system", "{}") +
                    make("bad-in-out", "out", "{kvoffload.io/inject: 'true'}");
  for (const char* name : {"bad-in-system", "bad-in-out"}) {
    const size_t at = bad.find(std::string("name: ") + name);
    const size_t spec = bad.find("1Gi", at);
    bad.replace(spec, 3, "0");
  }
  Result<InjectResult> skipped = InjectManifests(bad, InjectOptions{});
  ASSERT_TRUE(skipped.ok()) << skipped.status().message();
}

// A workload without its pod template: the error named no document or field (a JSON
// library's "key 'template' not found").
TEST(InjectTest, WorkloadWithoutATemplateIsNamed) {
  Result<InjectResult> out = InjectManifests(
      "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: team}\n"
      "spec: {replicas: 1}\n",
      InjectOptions{});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "Deployment team/d: spec.template: no pod template here");
}

TEST(InjectTest, JsonInJsonOut) {
  const char* pod = R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}},"spec":{"containers":[{"name":"main","image":"x"}]}})";
  Result<InjectResult> out = InjectManifests(pod, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  ojson doc = ojson::parse(out->output);
  EXPECT_EQ(doc["spec"]["containers"][0]["env"][0]["name"], "KVOFFLOAD_CPU_BYTES");
  EXPECT_EQ(doc["spec"]["containers"][0]["env"][0]["value"], "1073741824");
}

// Merge keys as kubectl's YAML reader applies them: the mapping's own keys win wherever they
// stand, then the first merged mapping that has a key. Read as a field named "<<", the limits
// and env of `base` were lost: validate passed a pod the webhook denies, and inject dropped them.
TEST(InjectTest, MergeKeysAreAppliedAsKubectlAppliesThem) {
  const std::vector<ojson> docs = Docs(R"(base: &base {image: vllm, env: [{name: A, value: "1"}]}
extra: &extra {image: other, tty: true}
pod:
  <<: [*base, *extra]
  name: main
  image: mine
quoted: {"<<": *base}
)");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0]["pod"], ojson::parse(R"({"env": [{"name": "A", "value": "1"}],
      "tty": true, "name": "main", "image": "mine"})"))
      << docs[0]["pod"].dump();
  // A quoted "<<" is a key like any other.
  EXPECT_TRUE(docs[0]["quoted"].contains("<<"));
  Result<std::vector<ojson>> bad = ParseYamlDocuments("a: {<<: 3}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a merge key (<<) must name a mapping"), std::string::npos)
      << bad.status().message();

  const char* pod = R"(x-base: &base
  image: vllm
  resources: {limits: {memory: 8Gi}}
apiVersion: v1
kind: Pod
metadata: {name: m1, annotations: {kvoffload.io/config: '{"cpu":"100Gi"}'}}
spec:
  containers:
  - <<: *base
    name: main
)";
  Result<InjectResult> out = InjectManifests(pod, InjectOptions{});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("does not fit in container \"main\"'s memory limit 8Gi"),
            std::string::npos)
      << out.status().message();
}

// An unrendered Helm chart: `name: {{ .Release.Name }}` is a mapping used as a key, which read
// as "null" and was written back as {"null": null}, injected and exit 0. Refused, naming the
// line and what to do; kubectl refuses such keys too.
TEST(InjectTest, TemplateKeysOfAnUnrenderedChartAreRefused) {
  for (const char* doc : {"metadata:\n  name: {{ .Release.Name }}\n", "? [a, b]\n: x\n"}) {
    SCOPED_TRACE(doc);
    Result<std::vector<ojson>> parsed = ParseYamlDocuments(doc);
    ASSERT_FALSE(parsed.ok());
    EXPECT_NE(parsed.status().message().find("is used as a key (line "), std::string::npos)
        << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("helm template"), std::string::npos);
  }
}

// A few hundred bytes of aliases of aliases ("billion laughs") took 2.7 GB and 18 s to expand,
// and at nine levels aborted: refused once the expansion passes what any manifest holds.
TEST(InjectTest, ExcessiveAliasingIsRefused) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    const char prev = static_cast<char>(c - 1);
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) bomb += std::string(i ? ", *" : "*") + prev;
    bomb += "]\n";
  }
  Result<std::vector<ojson>> docs = ParseYamlDocuments(bomb);
  ASSERT_FALSE(docs.ok());
  EXPECT_NE(docs.status().message().find("excessive aliasing"), std::string::npos)
      << docs.status().message();
  // Aliases a manifest uses are fine.
  EXPECT_EQ(Docs("a: &a {k: v}\nb: *a\nc: *a\n")[0]["c"]["k"], "v");
}

// NEL, LS and PS are line breaks to YAML 1.1 (kubectl's reader): written raw in a plain scalar
// the output did not read back. They are written escaped; other text stays as it is.
TEST(InjectTest, UnicodeLineBreaksAreWrittenEscaped) {
  const ojson doc = {{"a", "x\u2028y"}, {"b", "x\u0085y"}, {"c", "x\u2029y"}, {"d", "caf\u00e9"}};
  const std::string yaml = EmitYaml(doc);
  EXPECT_NE(yaml.find(R"(a: "x\u2028y")"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find(R"(b: "x\x85y")"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find(R"(c: "x\u2029y")"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("d: caf\u00e9"), std::string::npos) << yaml;
  EXPECT_EQ(Docs(yaml)[0], doc);
}

// CR, other C0 and C1 controls, DEL, U+FFFE/U+FFFF and a BOM inside a value were written raw
// into plain scalars: a CR read back as a line break ("line1\rline2" became "line1line2" on
// the next inject) and kubectl refused the rest. Each is written escaped and reads back.
TEST(InjectTest, ControlAndNonCharactersAreWrittenEscaped) {
  const ojson doc = {{"cr", "line1\rline2"}, {"cr_end", "foo\r"},  {"bell", "a\x07" "b"},
                     {"del", "a\x7f" "b"},   {"c1", "a\u0090b"},    {"bom", "a\ufeffb"},
                     {"tab", "a\tb"}};
  const std::string yaml = EmitYaml(doc);
  for (char c : yaml) {
    EXPECT_TRUE(c == '\n' || c == '\t' || static_cast<unsigned char>(c) >= 0x20) << yaml;
    EXPECT_NE(c, '\x7f') << yaml;
  }
  EXPECT_EQ(yaml.find("\xEF\xBB\xBF"), std::string::npos) << yaml;
  EXPECT_EQ(Docs(yaml)[0], doc) << yaml;
  EXPECT_EQ(EmitYaml(Docs(yaml)[0]), yaml);
  // U+FFFE and U+FFFF, which yaml-cpp writes as U+FFFD, are refused on reading, naming the line.
  for (const char* input : {"a: x\nb: \"a\\ufffeb\"\n", "a: x\nb: \"a\\uffffb\"\n"}) {
    Result<std::vector<ojson>> docs = ParseYamlDocuments(input);
    ASSERT_FALSE(docs.ok()) << input;
    EXPECT_NE(docs.status().message().find("U+FFFE or U+FFFF in a string (line 2)"),
              std::string::npos)
        << docs.status().message();
  }
}

// `cat *.yaml | inject -f -` where one file was saved with a byte order mark: it starts a
// later document, where it became part of the first key ("\ufeffkind"), so the Deployment
// was passed over, neither injected nor validated.
TEST(InjectTest, AByteOrderMarkMayStartAnyDocument) {
  const std::string stream =
      "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n\xEF\xBB\xBF"
      "kind: Deployment\napiVersion: apps/v1\nmetadata: {name: d}\nspec:\n  template:\n"
      "    metadata:\n      annotations: {kvoffload.io/config: '{\"cpu\": \"1Gi\"}'}\n"
      "    spec:\n      containers: [{name: main, image: vllm}]\n";
  const std::vector<ojson> docs = Docs(stream);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1]["kind"], "Deployment") << docs[1].dump();
  Result<InjectResult> out = InjectManifests(stream, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_NE(out->output.find("KVOFFLOAD_CPU_BYTES"), std::string::npos) << out->output;
  // A byte order mark inside a value is data, written escaped (above).
  EXPECT_EQ(Docs("a: \"x\\ufeffy\"\n")[0]["a"], "x\ufeffy");
}

// A typed list as the API serves it (PodList, DeploymentList) is read as kubectl reads it: its
// items, which carry no kind or apiVersion, take the list's. It was skipped: validate said "0
// checked" of a PodList whose pod was invalid.
TEST(InjectTest, TypedListsAreReadAsTheirItems) {
  const char* list = R"({"apiVersion": "v1", "kind": "PodList", "items": [
      {"metadata": {"name": "p", "annotations": {"kvoffload.io/config": "{\"cpu\":\"1Gi\"}"}},
       "spec": {"containers": [{"name": "main", "image": "vllm"}]}}]})";
  Result<InjectResult> out = InjectManifests(list, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  const ojson item = ojson::parse(out->output)["items"][0];
  EXPECT_EQ(item["kind"], "Pod");
  EXPECT_EQ(item["apiVersion"], "v1");
  EXPECT_EQ(item["spec"]["containers"][0]["env"][0]["name"], "KVOFFLOAD_CPU_BYTES") << item.dump();
  std::string bad = list;
  bad.replace(bad.find("1Gi"), 3, "-1");
  Result<std::vector<ObjectReport>> reports = ValidateManifests(bad, InjectOptions{});
  ASSERT_TRUE(reports.ok()) << reports.status().message();
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_FALSE((*reports)[0].errors.empty());
}

TEST(InjectTest, LeaderWorkerSetBothTemplatesAndListKind) {
  const char* lws = R"(apiVersion: v1
kind: List
items:
- apiVersion: leaderworkerset.x-k8s.io/v1
  kind: LeaderWorkerSet
  metadata: {name: big}
  spec:
    replicas: 1
    leaderWorkerTemplate:
      size: 4
      leaderTemplate:
        metadata: {annotations: {kvoffload.io/config: '{"cpu":"2Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"rwo"}}}}]}'}}
        spec: {containers: [{name: main, image: x}]}
      workerTemplate:
        metadata: {annotations: {kvoffload.io/config: '{"cpu":"4Gi"}'}}
        spec: {containers: [{name: main, image: x}]}
)";
  Result<InjectResult> out = InjectManifests(lws, InjectOptions{});
  ASSERT_TRUE(out.ok()) << out.status().message();
  ojson doc = Docs(out->output)[0]["items"][0];
  const ojson& lwt = doc["spec"]["leaderWorkerTemplate"];
  EXPECT_EQ(lwt["workerTemplate"]["spec"]["containers"][0]["env"][0]["value"], "4294967296");
  EXPECT_EQ(lwt["leaderTemplate"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], "rwo");
  // Offline the PVC cannot be checked: a warning, not a denial. In agent mode it also says
  // what the agent does without the PVC's size (KVOFFLOAD_TIERS' capacityBytes 0) and access
  // modes; vLLM's own tiers (vllm-native) take neither.
  ASSERT_FALSE(out->warnings.empty());
  EXPECT_NE(out->warnings[0].find("LeaderWorkerSet default/big: PVC rwo was not checked"),
            std::string::npos)
      << out->warnings[0];
  const std::string agent_does = "the agent sizes its tier from the file system mounted there";
  EXPECT_EQ(out->warnings[0].find(agent_does), std::string::npos) << out->warnings[0];
  InjectOptions agent;
  agent.default_mode = Mode::kAgent;
  agent.agent_image = "kv-offload/offload-agent:test";
  out = InjectManifests(lws, agent);
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_FALSE(out->warnings.empty());
  EXPECT_NE(out->warnings[0].find(agent_does + " and does not share it across replicas"),
            std::string::npos)
      << out->warnings[0];
}

TEST(InjectTest, DenialNamesTheDocument) {
  const char* bad = R"(apiVersion: apps/v1
kind: StatefulSet
metadata: {name: s, namespace: ns1}
spec:
  template:
    metadata: {annotations: {kvoffload.io/config: '{"cpu":"1Gi","evictionPolicy":"fifo"}'}}
    spec: {containers: [{name: main, image: x}]}
)";
  Result<InjectResult> out = InjectManifests(bad, InjectOptions{});
  ASSERT_FALSE(out.ok());
  // The template's field path comes between the document and the pod denial.
  EXPECT_NE(out.status().message().find(
                "StatefulSet ns1/s: spec.template: kvCacheOffloading from pod annotation"),
            std::string::npos)
      << out.status().message();
  EXPECT_NE(out.status().message().find("\"fifo\" is not supported"), std::string::npos);
  EXPECT_FALSE(InjectManifests("a: [unclosed", InjectOptions{}).ok());
}

TEST(InjectTest, ConfigFlagAndOptOut) {
  const char* job = R"(apiVersion: batch/v1
kind: Job
metadata: {name: j}
spec:
  template:
    spec: {containers: [{name: main, image: x}], restartPolicy: Never}
---
apiVersion: v1
kind: Pod
metadata: {name: skip, labels: {kvoffload.io/inject: "false"}}
spec: {containers: [{name: main, image: x}]}
)";
  InjectOptions opts;
  opts.config = nlohmann::json{{"cpu", "3Gi"}};
  Result<InjectResult> out = InjectManifests(job, opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  std::vector<ojson> docs = Docs(out->output);
  EXPECT_TRUE(docs[0]["spec"]["template"]["spec"]["containers"][0].contains("env"));
  EXPECT_FALSE(docs[1]["spec"]["containers"][0].contains("env"));
  EXPECT_NE(out->output.find("the --config flag"), std::string::npos);
}

}  // namespace
}  // namespace kvoffload::webhook
