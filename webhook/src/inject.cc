#include "webhook/inject.h"

#include "webhook/cluster_reader.h"
#include "webhook/json_util.h"
#include "webhook/resolver.h"
#include "webhook/validation.h"
#include "webhook/workload.h"

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

// Rewrites a pod-rooted pointer ("/spec/volumes/-") under the template's pointer.
json Rebase(const json& patch, const std::string& prefix) {
  json out = patch;
  for (json& op : out) op["path"] = prefix + op["path"].get<std::string>();
  return out;
}

// The input's documents in their own order and format.
struct Documents {
  std::vector<ojson> docs;
  std::vector<std::string> prefixes;  // per document: "FILE: " when read from several files
  bool is_json = false;
  bool json_list = false;    // a JSON array of objects
  bool json_stream = false;  // JSON values one after another
  // Every object, list documents flattened into their items, with `prefixes` set to each
  // one's. As kubectl reads them: any kind ending in "List" with items (`kind: List` from
  // kubectl get -o yaml, a PodList or DeploymentList as the API serves it), and an item without
  // kind and apiVersion (the API server leaves them out of a typed list's items) takes the
  // list's apiVersion and its kind less "List".
  std::vector<ojson*> Objects(std::vector<std::string>* object_prefixes) {
    std::vector<ojson*> objects;
    for (size_t i = 0; i < docs.size(); ++i) {
      ojson& d = docs[i];
      const std::string kind = d.is_object() ? StringOr(d, "kind", "") : "";
      if (kind.ends_with("List") && d.contains("items") && d["items"].is_array()) {
        for (ojson& item : d["items"]) {
          if (item.is_object() && !item.contains("kind") && !item.contains("apiVersion") &&
              kind != "List") {
            ojson typed = {{"apiVersion", StringOr(d, "apiVersion", "")},
                           {"kind", kind.substr(0, kind.size() - 4)}};
            for (auto& [key, value] : item.items()) typed[key] = std::move(value);
            item = std::move(typed);
          }
          objects.push_back(&item);
        }
      } else {
        objects.push_back(&d);
      }
      object_prefixes->resize(objects.size(), prefixes[i]);
    }
    return objects;
  }
};

// One file's documents onto `out->docs`; a parse error names the file when it has a name.
// The top-level JSON values of `input` when it is a stream of them ({...}{...}, or one per
// line, as kubectl reads them); nullopt when it is not. Only their bounds are found here (each
// is parsed by ParseJson): simdjson's parse_many gives a document's text only through an API
// it marks experimental, and needs a batch window larger than the largest document.
std::optional<std::vector<std::string_view>> JsonStream(std::string_view input) {
  std::vector<std::string_view> values;
  size_t depth = 0, start = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < input.size(); ++i) {
    const char c = input[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (depth++ == 0) start = i;
    } else if (c == '}' || c == ']') {
      if (depth == 0) return std::nullopt;
      if (--depth == 0) values.push_back(input.substr(start, i + 1 - start));
    } else if (depth == 0 && c != ' ' && c != '\t' && c != '\r' && c != '\n') {
      return std::nullopt;
    }
  }
  if (depth != 0 || in_string || values.size() < 2) return std::nullopt;
  return values;
}

Status ReadFileDocuments(const ManifestFile& file, Documents* out) {
  std::string_view input = file.text;
  const std::string where = file.name.empty() ? "" : file.name + ": ";
  if (input.starts_with("\xEF\xBB\xBF")) input.remove_prefix(3);  // a UTF-8 BOM
  const size_t first = input.find_first_not_of(" \t\r\n");
  const bool looks_json =
      first != std::string_view::npos && (input[first] == '{' || input[first] == '[');
  if (looks_json) {
    // ParseJson checks the input (depth limit, a message naming the error); the document is
    // then read again as ordered_json, since json would sort every object's keys.
    Result<json> parsed = ParseJson(input, "input");
    if (parsed.ok()) {
      out->is_json = true;
      ojson doc = ojson::parse(input);
      if (doc.is_array()) {
        out->json_list = true;
        for (ojson& d : doc) out->docs.push_back(std::move(d));
      } else {
        out->docs.push_back(std::move(doc));
      }
      return Status::Ok();
    }
    // Several JSON values one after another, which kubectl reads as documents.
    if (std::optional<std::vector<std::string_view>> stream = JsonStream(input)) {
      std::vector<ojson> docs;
      for (std::string_view value : *stream) {
        if (!ParseJson(value, "input").ok()) break;
        docs.push_back(ojson::parse(value));
      }
      if (docs.size() == stream->size()) {
        out->is_json = out->json_stream = true;
        for (ojson& d : docs) out->docs.push_back(std::move(d));
        return Status::Ok();
      }
    }
    // YAML in flow style ({apiVersion: v1, ...}) starts as JSON does; JSON's error is the one
    // reported when YAML cannot read it either.
    Result<std::vector<ojson>> yaml = ParseYamlDocuments(input);
    if (!yaml.ok()) return Status::InvalidArgument(where + parsed.status().message());
    for (ojson& d : *yaml) out->docs.push_back(std::move(d));
    return Status::Ok();
  }
  Result<std::vector<ojson>> parsed = ParseYamlDocuments(input);
  if (!parsed.ok()) return Status::InvalidArgument(where + parsed.status().message());
  for (ojson& d : *parsed) out->docs.push_back(std::move(d));
  return Status::Ok();
}

// Every file's documents in order. Only a single JSON file is written back as JSON: a stream
// of several files is YAML, which also reads JSON documents.
// Objects are named by their file only when there are several (a single file's parse errors
// still name it, unless it is stdin).
Result<Documents> ReadDocuments(const std::vector<ManifestFile>& files) {
  Documents out;
  for (const ManifestFile& file : files) {
    if (Status s = ReadFileDocuments(file, &out); !s.ok()) return s;
    out.prefixes.resize(out.docs.size(), files.size() > 1 ? file.name + ": " : "");
  }
  // kubectl says "no objects passed to apply". An empty input is what a failed step before
  // this one leaves (`kustomize build broken | inject -f -`): written out as an empty
  // manifest, or passed by validate as "0 checked", the failure went on unseen.
  if (out.docs.empty()) {
    std::string names;
    for (const ManifestFile& file : files) {
      names += (names.empty() ? "" : ", ") + (file.name.empty() ? "stdin" : file.name);
    }
    return Status::InvalidArgument("the input (" + names + ") holds no object; give the "
                                   "manifests to read");
  }
  if (files.size() != 1) out.is_json = out.json_list = out.json_stream = false;
  return out;
}

std::string NamespaceOf(const json& doc, const InjectOptions& options) {
  if (doc.contains("metadata") && doc["metadata"].is_object()) {
    if (std::string ns = StringAt(doc["metadata"], "namespace"); !ns.empty()) return ns;
  }
  return options.namespace_name;
}

// Whether the webhooks would be called for a pod of `ns` (deploy.md): never for one labelled
// kvoffload.io/inject=false, nor in kube-system or our own namespace; where the input holds
// the Namespace, every pod of one labelled kvoffload.io/injection=enabled, none of one
// labelled otherwise, and in one without the label only pods labelled
// kvoffload.io/inject=true. A namespace the input does not hold is
// not known here: its pods are injected as asked (the user ran inject on them).
bool SelectedOffline(const JsonView& pod, const std::string& ns, ClusterReader& reader) {
  if (OptedOut(pod) || ns == "kube-system" || ns == "kv-offload-system") return false;
  Result<std::optional<json>> found = reader.Get(ObjectRef{ObjectKind::kNamespace, ns, ns});
  if (!found.ok() || !found->has_value()) return true;
  const json& namespace_object = **found;
  const json::json_pointer label("/metadata/labels/kvoffload.io~1injection");
  if (!namespace_object.contains(label)) return OptedIn(pod);
  return namespace_object[label] == "enabled";
}

// Whether any pod template of `object` would reach the webhooks (all but the templates' kinds:
// true). A workload in a namespace they never see (kube-system, one labelled
// kvoffload.io/injection=disabled) was checked anyway, and one bad spec there failed the
// whole stream, though neither webhook is called for it in a cluster.
bool AnyTemplateSelected(const json& object, const std::string& ns, ClusterReader& reader) {
  const std::vector<std::string> templates = PodTemplatePointers(object);
  if (templates.empty()) return true;
  return std::any_of(templates.begin(), templates.end(), [&](const std::string& pointer) {
    const json::json_pointer p(pointer);
    if (!object.contains(p)) return true;  // said where it is missing
    const JsonDocument document = JsonDocument::Of(object.at(p));
    return SelectedOffline(document.Root(), ns, reader);
  });
}

// Validates every object against the others (LLMInferenceService, Namespace and PVC documents
// resolve specs, as a cluster would), never stopping at the first problem. Each report's object
// starts with its prefix (the file it came from, or nothing).
// `selected_only`: for inject, which writes back only what the webhooks would see; `validate`
// checks every spec it is given.
Result<std::vector<ObjectReport>> ValidateObjects(const std::vector<json>& objects,
                                                  const std::vector<std::string>& prefixes,
                                                  const InjectOptions& options,
                                                  bool selected_only) {
  // Offline we only know the documents given: a PVC missing from them proves nothing.
  StaticClusterReader reader(objects, options.namespace_name, /*authoritative=*/false);
  ValidationOptions vo;
  vo.default_mode = options.default_mode;
  vo.agent_image = options.agent_image;
  vo.fallback_config = options.config;
  vo.kserve_namespace = options.kserve_namespace;
  std::vector<ObjectReport> reports;
  for (size_t i = 0; i < objects.size(); ++i) {
    const json& object = objects[i];
    if (!object.is_object()) continue;
    const std::string ns = NamespaceOf(object, options);
    if (selected_only && !AnyTemplateSelected(object, ns, reader)) continue;
    Result<ObjectReport> report = ValidateObject(object, ns, vo, &reader);
    if (!report.ok()) return report.status();
    if (!report->checked) continue;
    report->object = prefixes[i] + report->object;
    reports.push_back(std::move(*report));
  }
  return reports;
}

std::vector<json> AsJson(const std::vector<ojson*>& objects) {
  std::vector<json> out;
  for (const ojson* o : objects) out.push_back(json::parse(o->dump()));
  return out;
}

Result<InjectResult> InjectUnchecked(const std::vector<ManifestFile>& files,
                                     const InjectOptions& options) {
  Result<Documents> read = ReadDocuments(files);
  if (!read.ok()) return read.status();
  Documents& in = *read;
  std::vector<std::string> prefixes;
  std::vector<ojson*> objects = in.Objects(&prefixes);
  const std::vector<json> cluster_objects = AsJson(objects);

  // Every problem in every document first, so one run shows them all.
  Result<std::vector<ObjectReport>> reports =
      ValidateObjects(cluster_objects, prefixes, options, /*selected_only=*/true);
  if (!reports.ok()) return reports.status();
  InjectResult result;
  std::string errors;
  for (const ObjectReport& r : *reports) {
    for (const std::string& e : r.errors) errors += (errors.empty() ? "" : "\n") + r.object + ": " + e;
    for (const std::string& w : r.warnings) result.warnings.push_back(r.object + ": " + w);
  }
  if (!errors.empty()) return Status::InvalidArgument(errors);

  StaticClusterReader reader(cluster_objects, options.namespace_name, /*authoritative=*/false);
  for (size_t i = 0; i < objects.size(); ++i) {
    ojson* doc = objects[i];
    if (!doc->is_object()) continue;
    const json whole = json::parse(doc->dump());
    const std::string ns = NamespaceOf(whole, options);
    for (const std::string& pointer : PodTemplatePointers(whole)) {
      const std::string what = prefixes[i] + DescribeObject(whole, ns);
      // The template as it is: a missing metadata stays missing, so the patch adds it whole.
      if (!whole.contains(json::json_pointer(pointer))) {
        std::string path = pointer.substr(1);
        std::replace(path.begin(), path.end(), '/', '.');
        return Status::InvalidArgument(what + ": " + path + ": no pod template here");
      }
      JsonDocument document = JsonDocument::Of(whole.at(json::json_pointer(pointer)));
      const JsonView pod = document.Root();
      if (!SelectedOffline(pod, ns, reader)) continue;
      Result<Resolution> res = Resolve(pod, ns, &reader, options.kserve_namespace);
      if (!res.ok()) return Status::InvalidArgument(what + ": " + res.status().message());
      if (!res->spec && options.config) {
        res->source = SpecSource::CommandLine();
        Result<OffloadSpec> spec = ParseSpecFrom(*options.config, res->source);
        if (!spec.ok()) return Status::InvalidArgument(what + ": " + spec.status().message());
        res->spec = std::move(*spec);
      }
      if (!res->spec) continue;
      // Its warnings are the validation's, already collected.
      Mutation m = Mutate(MutationInput(std::move(document), pod, ns, std::move(*res),
                                        {options.default_mode, options.agent_image},
                                        WorkloadReplicas(whole)));
      if (!m.allowed) return Status::InvalidArgument(what + ": " + m.denial);
      if (m.patch.empty()) continue;
      try {
        *doc = doc->patch(ojson::parse(Rebase(json::parse(m.patch), pointer).dump()));
      } catch (const ojson::exception& e) {
        return Status::Internal(what + ": patch did not apply: " + e.what());
      }
    }
  }

  if (in.is_json && in.json_stream) {
    for (const ojson& doc : in.docs) result.output += doc.dump(2) + "\n";
  } else if (in.is_json) {
    result.output = (in.json_list ? ojson(in.docs) : in.docs.front()).dump(2) + "\n";
  } else {
    for (size_t i = 0; i < in.docs.size(); ++i) {
      if (i > 0) result.output += "---\n";
      result.output += EmitYaml(in.docs[i]);
    }
  }
  return result;
}

Result<std::vector<ObjectReport>> ValidateUnchecked(const std::vector<ManifestFile>& files,
                                                    const InjectOptions& options) {
  Result<Documents> read = ReadDocuments(files);
  if (!read.ok()) return read.status();
  std::vector<std::string> prefixes;
  const std::vector<json> objects = AsJson(read->Objects(&prefixes));
  return ValidateObjects(objects, prefixes, options, /*selected_only=*/false);
}

}  // namespace

Result<InjectResult> InjectManifests(const std::vector<ManifestFile>& files,
                                     const InjectOptions& options) {
  // The edge for library exceptions: a manifest nlohmann cannot represent or patch is the
  // input's fault and gets a message, never a terminate (the command line shows it).
  try {
    return InjectUnchecked(files, options);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("input cannot be processed: ") + e.what());
  }
}

Result<InjectResult> InjectManifests(std::string_view input, const InjectOptions& options) {
  return InjectManifests({ManifestFile{"", std::string(input)}}, options);
}

Result<std::vector<ObjectReport>> ValidateManifests(const std::vector<ManifestFile>& files,
                                                    const InjectOptions& options) {
  try {
    return ValidateUnchecked(files, options);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("input cannot be processed: ") + e.what());
  }
}

Result<std::vector<ObjectReport>> ValidateManifests(std::string_view input,
                                                    const InjectOptions& options) {
  return ValidateManifests({ManifestFile{"", std::string(input)}}, options);
}

}  // namespace kvoffload::webhook
