#include "webhook/inject.h"

#include "webhook/cluster_reader.h"
#include "webhook/json_util.h"
#include "webhook/resolver.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// obj[key] when it is a string, else `fallback`. ordered_json::value() throws when the key
// holds another type ("kind: {a: b}"; found by fuzzing), and a manifest is user input.
std::string StringOr(const ojson& obj, const char* key, std::string fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

struct Template {
  std::string pointer;  // "" for a Pod, else where the pod template lives
};

// Where the pod templates of a workload kind live; empty for kinds we pass through.
std::vector<Template> TemplatesOf(const ojson& doc) {
  const std::string kind = StringOr(doc, "kind", "");
  if (kind == "Pod") return {{""}};
  if (kind == "Deployment" || kind == "StatefulSet" || kind == "ReplicaSet" ||
      kind == "DaemonSet" || kind == "Job") {
    return {{"/spec/template"}};
  }
  if (kind == "CronJob") return {{"/spec/jobTemplate/spec/template"}};
  if (kind == "LeaderWorkerSet") {
    std::vector<Template> out{{"/spec/leaderWorkerTemplate/workerTemplate"}};
    if (doc.contains(ojson::json_pointer("/spec/leaderWorkerTemplate/leaderTemplate"))) {
      out.push_back({"/spec/leaderWorkerTemplate/leaderTemplate"});
    }
    return out;
  }
  return {};
}

// How many pods the workload runs at once (only "more than one" matters: RWO warnings).
int ReplicasOf(const ojson& doc) {
  const std::string kind = StringOr(doc, "kind", "");
  auto int_at = [&doc](const char* pointer, int64_t fallback) {
    const ojson::json_pointer p(pointer);
    return doc.contains(p) && doc[p].is_number_integer() ? doc[p].get<int64_t>() : fallback;
  };
  int64_t n = 1;
  if (kind == "Deployment" || kind == "StatefulSet" || kind == "ReplicaSet") n = int_at("/spec/replicas", 1);
  if (kind == "Job") n = int_at("/spec/parallelism", 1);
  if (kind == "DaemonSet") n = 2;  // one per node: always more than one
  if (kind == "LeaderWorkerSet") {
    n = int_at("/spec/replicas", 1) * int_at("/spec/leaderWorkerTemplate/size", 1);
  }
  return static_cast<int>(std::clamp<int64_t>(n, 1, 1 << 20));
}

std::string Describe(const ojson& doc, const std::string& ns) {
  const ojson& meta = doc.contains("metadata") ? doc["metadata"] : ojson();
  std::string name = meta.is_object() ? StringOr(meta, "name", "") : "";
  if (name.empty() && meta.is_object()) name = StringOr(meta, "generateName", "");
  return StringOr(doc, "kind", "object") + " " + ns + "/" + name;
}

// Rewrites a pod-rooted pointer ("/spec/volumes/-") under the template's pointer.
json Rebase(const json& patch, const std::string& prefix) {
  json out = patch;
  for (json& op : out) op["path"] = prefix + op["path"].get<std::string>();
  return out;
}

Result<InjectResult> InjectUnchecked(std::string_view input, const InjectOptions& options) {
  const size_t first = input.find_first_not_of(" \t\r\n");
  const bool is_json = first != std::string_view::npos && (input[first] == '{' || input[first] == '[');
  std::vector<ojson> docs;
  bool json_list = false;
  if (is_json) {
    Result<json> parsed = ParseJson(input, "input");
    if (!parsed.ok()) return parsed.status();
    ojson doc = ojson::parse(parsed->dump());
    if (doc.is_array()) {
      json_list = true;
      for (ojson& d : doc) docs.push_back(std::move(d));
    } else {
      docs.push_back(std::move(doc));
    }
  } else {
    Result<std::vector<ojson>> parsed = ParseYamlDocuments(input);
    if (!parsed.ok()) return parsed.status();
    docs = std::move(*parsed);
  }
  // `kind: List` documents (kubectl get -o yaml) are flattened for lookup and injection.
  std::vector<ojson*> objects;
  for (ojson& d : docs) {
    if (d.is_object() && StringOr(d, "kind", "") == "List" && d.contains("items") && d["items"].is_array()) {
      for (ojson& item : d["items"]) objects.push_back(&item);
    } else {
      objects.push_back(&d);
    }
  }

  std::vector<json> cluster_objects;
  for (const ojson* o : objects) cluster_objects.push_back(json::parse(o->dump()));
  // Offline we only know the documents given: a PVC missing from them proves nothing.
  StaticClusterReader reader(cluster_objects, options.namespace_name, /*authoritative=*/false);

  InjectResult result;
  for (ojson* doc : objects) {
    if (!doc->is_object()) continue;
    std::string ns = options.namespace_name;
    if (doc->contains("metadata") && (*doc)["metadata"].is_object()) {
      ns = StringOr((*doc)["metadata"], "namespace", ns);
    }
    for (const Template& t : TemplatesOf(*doc)) {
      const std::string what = Describe(*doc, ns);
      json pod;
      if (t.pointer.empty()) {
        pod = json::parse(doc->dump());
      } else {
        const ojson::json_pointer p(t.pointer);
        if (!doc->contains(p) || !(*doc)[p].is_object()) {
          return Status::InvalidArgument(what + ": no pod template at " + t.pointer);
        }
        // The template as it is: a missing metadata stays missing, so the patch adds it whole.
        pod = json::parse((*doc)[p].dump());
      }
      const json no_labels;
      const json& labels = pod.contains("metadata") && pod["metadata"].is_object() &&
                                   pod["metadata"].contains("labels")
                               ? pod["metadata"]["labels"]
                               : no_labels;
      if (StringAt(labels, kLabelInject) == "false") continue;
      Result<Resolution> res = Resolve(pod, ns, &reader);
      if (!res.ok()) return Status::InvalidArgument(what + ": " + res.status().message());
      if (!res->spec && options.config) {
        res->source = SpecSource::CommandLine();
        Result<OffloadSpec> spec = ParseSpecFrom(*options.config, res->source);
        if (!spec.ok()) return Status::InvalidArgument(what + ": " + spec.status().message());
        res->spec = std::move(*spec);
      }
      if (!res->spec) continue;
      MutationInput in;
      in.pod = std::move(pod);
      in.namespace_name = ns;
      in.spec = std::move(*res->spec);
      in.source = res->source;
      in.default_mode = options.default_mode;
      in.agent_image = options.agent_image;
      in.replicas = std::max(res->replicas, ReplicasOf(*doc));
      in.pvcs = std::move(res->pvcs);
      Mutation m = Mutate(in);
      if (!m.allowed) return Status::InvalidArgument(what + ": " + m.denial);
      for (const std::string& w : m.warnings) result.warnings.push_back(what + ": " + w);
      if (m.patch.empty()) continue;
      try {
        *doc = doc->patch(ojson::parse(Rebase(m.patch, t.pointer).dump()));
      } catch (const ojson::exception& e) {
        return Status::Internal(what + ": patch did not apply: " + e.what());
      }
    }
  }

  if (is_json) {
    result.output = (json_list ? ojson(docs) : docs.front()).dump(2) + "\n";
  } else {
    for (size_t i = 0; i < docs.size(); ++i) {
      if (i > 0) result.output += "---\n";
      result.output += EmitYaml(docs[i]);
    }
  }
  return result;
}

}  // namespace

Result<InjectResult> InjectManifests(std::string_view input, const InjectOptions& options) {
  // The edge for library exceptions: a manifest nlohmann cannot represent or patch is the
  // input's fault and gets a message, never a terminate (the command line shows it).
  try {
    return InjectUnchecked(input, options);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("input cannot be processed: ") + e.what());
  }
}

}  // namespace kvoffload::webhook
