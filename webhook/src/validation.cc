#include "webhook/validation.h"

#include <algorithm>
#include <set>

#include "webhook/json_util.h"
#include "webhook/resolver.h"
#include "webhook/spec.h"
#include "webhook/workload.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

const json& Field(const json& obj, const char* key) {
  static const json kNull;
  return obj.is_object() && obj.contains(key) && !obj[key].is_null() ? obj[key] : kNull;
}

// Forwards lookups but never lets a missing PVC become a denial: it is reported as not checked
// to the resolver and remembered, so the caller can warn about it in its own words.
class ApplyTimeReader final : public ClusterReader {
 public:
  explicit ApplyTimeReader(ClusterReader* inner) : inner_(inner) {}
  Result<std::optional<json>> GetBefore(const ObjectRef& ref, Deadline deadline) override {
    Result<std::optional<json>> got = inner_->GetBefore(ref, deadline);
    if (got.ok() && !got->has_value() && ref.kind == ObjectKind::kPersistentVolumeClaim &&
        inner_->Authoritative()) {
      missing_pvcs_.insert(ref.name);
    }
    return got;
  }
  bool Authoritative() const override { return false; }
  const std::set<std::string>& missing_pvcs() const { return missing_pvcs_; }

 private:
  ClusterReader* inner_;
  std::set<std::string> missing_pvcs_;
};

// Mutate() says a PVC it was given no facts about "was not checked"; for one the cluster lacks,
// say that instead.
void AddWarnings(const Mutation& m, const std::set<std::string>& missing_pvcs,
                 const std::string& namespace_name, std::vector<std::string>* warnings) {
  for (const std::string& w : m.warnings) {
    std::string text = w;
    for (const std::string& name : missing_pvcs) {
      if (w == UncheckedPvcWarning(name, Mode::kAgent) ||
          w == UncheckedPvcWarning(name, Mode::kVllmNative)) {
        text = "PVC " + name + " not found in namespace " + namespace_name +
               ": its pods are denied until it exists";
      }
    }
    if (std::find(warnings->begin(), warnings->end(), text) == warnings->end()) {
      warnings->push_back(text);
    }
  }
}

std::string DottedPath(const std::string& pointer) {
  std::string out = pointer.substr(pointer.empty() ? 0 : 1);
  std::replace(out.begin(), out.end(), '/', '.');
  return out;
}

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

MutationOptions ForMutation(const ValidationOptions& options) {
  return {options.default_mode, options.agent_image};
}

// spec.workload.kvCacheOffloading, spec.kvCacheOffloading and their spec.prefill equivalents:
// every one present is validated (the resolver reads spec.kvCacheOffloading where both are
// set, but a broken other one is still a mistake, and two that differ get a warning), then the one the pods get is run through Mutate() on a pod
// built from the service's template, for the checks that need a container.
Status ValidateLLMInferenceService(const json& svc, const std::string& namespace_name,
                                   const ValidationOptions& options, ClusterReader* reader,
                                   ObjectReport* report) {
  const std::string name = StringAt(Field(svc, "metadata"), "name");
  // An LLMInferenceServiceConfig has a service's spec, merged under the services that name it
  // in spec.baseRefs: its fields are checked here, its template with each such service.
  const bool config = StringAt(svc, "kind") == "LLMInferenceServiceConfig";
  const SpecSource source =
      config ? SpecSource{SpecSource::Kind::kLLMInferenceService,
                          "LLMInferenceServiceConfig " + namespace_name + "/" + name}
             : SpecSource::LLMInferenceService(namespace_name, name);
  std::vector<FieldError> field_errors;
  std::vector<std::string> template_denials;
  for (const char* role : {"decode", "prefill"}) {
    const bool prefill = std::string(role) == "prefill";
    const json& scope = prefill ? Field(Field(svc, "spec"), "prefill") : Field(svc, "spec");
    const std::string scope_path = prefill ? "spec.prefill" : "spec";
    if (!scope.is_object()) continue;
    bool spec_valid = true;
    const json& inlined = Field(scope, "kvCacheOffloading");
    const json& nested = Field(Field(scope, "workload"), "kvCacheOffloading");
    if (!inlined.is_null() && !nested.is_null() && inlined != nested) {
      report->warnings.push_back(scope_path + ".kvCacheOffloading and " + scope_path +
                                 ".workload.kvCacheOffloading differ; the pods get the first "
                                 "(KServe renders from it): keep one");
    }
    // A config, and a service that names configs, may hold a part of the spec (the rest comes
    // merged from elsewhere): their own fields are checked as written, a missing cpu is not
    // theirs to give. The merged spec a service's pods get is checked whole below.
    const bool fragment = config || Field(Field(svc, "spec"), "baseRefs").is_array();
    for (const char* prefix : {"workload.", ""}) {
      const json& value = std::string(prefix).empty()
                              ? Field(scope, "kvCacheOffloading")
                              : Field(Field(scope, "workload"), "kvCacheOffloading");
      if (value.is_null()) continue;
      report->checked = true;
      // KServe's CRD has kvCacheOffloading in v1alpha2 only, at spec and spec.prefill, with no
      // workload field and no unknown fields kept: elsewhere the API server drops it without a
      // word, and no pod gets it (KServe's own sample writes spec.workload).
      const std::string where = scope_path + "." + prefix + "kvCacheOffloading";
      if (StringAt(svc, "apiVersion") == "serving.kserve.io/v1alpha1") {
        report->warnings.push_back(
            where + ": KServe's v1alpha1 LLMInferenceService has no kvCacheOffloading, so the "
            "API server drops it and no pod gets this spec; use apiVersion "
            "serving.kserve.io/v1alpha2 and " + scope_path + ".kvCacheOffloading");
      } else if (!std::string(prefix).empty()) {
        report->warnings.push_back(
            where + ": KServe's LLMInferenceService has no " + scope_path +
            ".workload field, so the API server drops it and no pod gets this spec; write " +
            scope_path + ".kvCacheOffloading");
      }
      json checked = value;
      if (fragment && value.is_object() && !value.contains("cpu")) checked["cpu"] = "1";
      bool policy_refused = false;
      for (FieldError& e : ParseSpec(checked).errors) {
        policy_refused = policy_refused || e.path.ends_with("evictionPolicy");
        e.path = scope_path + "." + prefix + e.path;
        field_errors.push_back(std::move(e));
        spec_valid = false;
      }
      // KServe's CRD types the field as an enum of vLLM's policies: a policy only the agent has
      // passed here, and the API server then refused the object (a GitOps check that passed a
      // manifest that cannot be applied). The agent's others go where no CRD types them.
      const std::string policy = StringAt(value, "evictionPolicy");
      if (!policy_refused && !policy.empty() && policy != "lru" && policy != "arc") {
        field_errors.push_back(
            {scope_path + "." + prefix + "kvCacheOffloading.evictionPolicy",
             "\"" + policy + "\" is not a value KServe's LLMInferenceService CRD takes (its enum: "
             "lru, arc), so the API server refuses the object; give the agent's other policies "
             "in the pod annotation " + std::string(kAnnotationConfig) +
                 " or the namespace annotation " + kAnnotationDefaultConfig});
        spec_valid = false;
      }
    }
    if (config || !spec_valid) continue;
    // What its pods get: the service's own over its baseRefs' (a config not found yet, as when
    // the service is applied before it, is a warning: apply order is not ours to choose).
    std::optional<ApplyTimeReader> configs_reader;
    if (reader != nullptr) configs_reader.emplace(reader);
    Result<ServiceSpec> merged =
        EffectiveServiceSpec(svc, role, namespace_name, configs_reader ? &*configs_reader : nullptr,
                             options.kserve_namespace);
    if (!merged.ok() && merged.status().code() == StatusCode::kInvalidArgument) {
      report->checked = true;
      template_denials.push_back(merged.status().message());
      continue;
    }
    if (!merged.ok()) return merged.status();
    if (!merged->value.is_null() || !merged->missing.empty()) report->checked = true;
    for (const std::string& missing : merged->missing) {
      std::string text = "spec.baseRefs: LLMInferenceServiceConfig " + missing +
                         (reader->Authoritative()
                              ? " not found in namespace " + namespace_name + " nor " +
                                    options.kserve_namespace +
                                    ": KServe renders no pods until it exists"
                              : " is not among the manifests given: its kvCacheOffloading, if "
                                "any, was not checked");
      if (std::find(report->warnings.begin(), report->warnings.end(), text) ==
          report->warnings.end()) {
        report->warnings.push_back(std::move(text));
      }
    }
    if (merged->value.is_null()) continue;
    SpecParse parsed = ParseSpec(merged->value);
    const SpecSource merged_source =
        SpecSource::LLMInferenceService(namespace_name, name, merged->configs);
    if (!parsed.errors.empty()) {
      for (FieldError& e : parsed.errors) {
        template_denials.push_back(merged_source.description + ": " + e.path + ": " + e.message);
      }
      continue;
    }

    // The pod KServe renders for this role, as far as the service says: its labels (which make
    // it a vLLM pod for Mutate) and its template; KServe's presets supply the container `main`.
    json pod = {{"metadata",
                 {{"labels",
                   {{"app.kubernetes.io/part-of", "llminferenceservice"},
                    {"app.kubernetes.io/name", name},
                    {"app.kubernetes.io/component", prefill
                                                         ? "llminferenceservice-workload-prefill"
                                                         : "llminferenceservice-workload"},
                    {"kserve.io/component", "workload"}}}}}};
    if (prefill) pod["metadata"]["labels"]["llm-d.ai/role"] = "prefill";
    json pod_spec = Field(scope, "template");
    if (!pod_spec.is_object()) pod_spec = Field(Field(scope, "workload"), "template");
    if (!pod_spec.is_object()) pod_spec = json::object();
    const json& containers = Field(pod_spec, "containers");
    if (!containers.is_array() || containers.empty()) {
      pod_spec["containers"] = json::array({{{"name", "main"}}});
    }
    pod["spec"] = std::move(pod_spec);

    // What the resolver returns for this role's pods.
    Resolution resolution;
    resolution.spec = std::move(parsed.spec);
    resolution.source = merged_source;
    resolution.replicas = merged->replicas;
    std::set<std::string> missing;
    if (reader != nullptr) {
      ApplyTimeReader apply_time(reader);
      Result<std::map<std::string, PvcInfo>> found =
          LookupPvcs(*resolution.spec, namespace_name, &apply_time);
      if (!found.ok()) return found.status();
      resolution.pvcs = std::move(*found);
      missing = apply_time.missing_pvcs();
    }
    const Mutation m = Mutate(MutationInput(std::move(pod), namespace_name,
                                            std::move(resolution), ForMutation(options)));
    if (!m.allowed) {
      for (const std::string& d : m.denials) {
        template_denials.push_back(scope_path + ".template: " + d);
      }
      continue;
    }
    AddWarnings(m, missing, namespace_name, &report->warnings);
  }
  for (const FieldError& e : field_errors) report->errors.push_back(e.path + ": " + e.message);
  for (const std::string& d : template_denials) report->errors.push_back(d);
  std::vector<std::string> parts;
  if (!field_errors.empty()) parts.push_back(FormatSpecErrors(field_errors, source));
  parts.insert(parts.end(), template_denials.begin(), template_denials.end());
  report->denial = Join(parts);
  return Status::Ok();
}

// The default-config annotation, parsed as the resolver parses it for a pod.
void ValidateNamespace(const json& ns, ObjectReport* report) {
  const std::string text =
      StringAt(Field(Field(ns, "metadata"), "annotations"), kAnnotationDefaultConfig);
  if (text.empty()) return;
  report->checked = true;
  const std::string name = StringAt(Field(ns, "metadata"), "name");
  const SpecSource source = SpecSource::NamespaceDefault(name);
  const std::string where = std::string("metadata.annotations[") + kAnnotationDefaultConfig + "]";
  Result<OffloadSpec> parsed = ParseSpecText(text, source);
  if (parsed.ok()) return;
  report->denial = parsed.status().message();
  Result<json> value = ParseJson(text, source.description);
  if (!value.ok()) {
    report->errors.push_back(where + ": " + report->denial);
    return;
  }
  for (const FieldError& e : ParseSpec(*value).errors) {
    report->errors.push_back(where + ": " + e.path + ": " + e.message);
  }
}

// Each pod template as the pod webhook will see its pods: resolved (annotation, owning
// LLMInferenceService, namespace default) and mutated, keeping the denial and the warnings.
Status ValidateWorkload(const json& object, const std::string& namespace_name,
                        const ValidationOptions& options, ClusterReader* reader,
                        ObjectReport* report) {
  for (const std::string& pointer : PodTemplatePointers(object)) {
    const std::string where = pointer.empty() ? "" : DottedPath(pointer) + ": ";
    const json::json_pointer p(pointer);
    if (!object.contains(p) || !object[p].is_object()) {
      // Whatever its spec: inject and the API server refuse it too.
      report->checked = true;
      report->errors.push_back(where + "no pod template here");
      continue;
    }
    JsonDocument document = JsonDocument::Of(object[p]);
    const JsonView pod = document.Root();
    if (OptedOut(pod) || (options.pods_need_label && !OptedIn(pod))) continue;

    std::optional<ApplyTimeReader> apply_time;
    if (reader != nullptr) apply_time.emplace(reader);
    Result<Resolution> res = Resolve(pod, namespace_name, apply_time ? &*apply_time : nullptr,
                                     options.kserve_namespace);
    if (!res.ok()) {
      if (res.status().code() != StatusCode::kInvalidArgument) return res.status();
      report->checked = true;
      report->errors.push_back(where + res.status().message());
      continue;
    }
    if (!res->spec && options.fallback_config) {
      res->source = SpecSource::CommandLine();
      Result<OffloadSpec> spec = ParseSpecFrom(*options.fallback_config, res->source);
      if (!spec.ok()) {
        report->checked = true;
        report->errors.push_back(where + spec.status().message());
        continue;
      }
      res->spec = std::move(*spec);
    }
    if (!res->spec) continue;
    report->checked = true;
    const Mutation m =
        Mutate(MutationInput(std::move(document), pod, namespace_name, std::move(*res),
                             ForMutation(options), WorkloadReplicas(object)));
    if (!m.allowed) {
      for (const std::string& d : m.denials) report->errors.push_back(where + d);
      continue;
    }
    AddWarnings(m, apply_time ? apply_time->missing_pvcs() : std::set<std::string>{},
                namespace_name, &report->warnings);
  }
  report->denial = Join(report->errors);
  return Status::Ok();
}

}  // namespace

Result<ObjectReport> ValidateObject(const json& object, const std::string& namespace_name,
                                    const ValidationOptions& options, ClusterReader* reader) {
  ObjectReport report;
  report.object = DescribeObject(object, namespace_name);
  if (!object.is_object()) return report;
  const std::string kind = StringAt(object, "kind");
  Status s;
  if (kind == "LLMInferenceService" || kind == "LLMInferenceServiceConfig") {
    s = ValidateLLMInferenceService(object, namespace_name, options, reader, &report);
  } else if (kind == "Namespace") {
    ValidateNamespace(object, &report);
  } else {
    s = ValidateWorkload(object, namespace_name, options, reader, &report);
  }
  if (!s.ok()) return s;
  return report;
}

}  // namespace kvoffload::webhook
