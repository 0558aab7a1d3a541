#include "webhook/resolver.h"

#include <algorithm>

#include "webhook/json_util.h"
#include "webhook/mutator.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

const json& Field(const json& obj, const char* key) {
  static const json kNull;
  return obj.is_object() && obj.contains(key) ? obj[key] : kNull;
}

PvcInfo ReadPvc(const json& pvc) {
  PvcInfo info;
  info.exists = true;
  const json& spec = Field(pvc, "spec");
  for (const json& mode : Field(spec, "accessModes")) {
    if (mode.is_string()) info.access_modes.push_back(mode.get<std::string>());
  }
  // Bound capacity is what the volume really has; the request is the fallback while pending.
  std::string cap = StringAt(Field(Field(pvc, "status"), "capacity"), "storage");
  if (cap.empty()) cap = StringAt(Field(Field(spec, "resources"), "requests"), "storage");
  if (Result<Quantity> q = Quantity::Parse(cap); q.ok() && q->Sign() > 0) info.capacity = *q;
  return info;
}

// A lookup the API server did not answer: Unavailable, naming the object.
Status CouldNotRead(const ObjectRef& ref, const Status& why) {
  return Status::Unavailable("could not read " + ref.ToString() + ": " + why.message());
}

// A name as the user wrote it, for a message: quoted, escaped, and short.
std::string QuotedName(const std::string& name) {
  return json(name.size() > 64 ? name.substr(0, 61) + "..." : name)
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

const json* LLMInferenceServiceSpec(const json& llmisvc, const std::string& role, int* replicas) {
  const json* scope = &Field(llmisvc, "spec");
  if (role == "prefill") scope = &Field(*scope, "prefill");
  if (!scope->is_object()) return nullptr;
  if (const json& r = Field(*scope, "replicas"); r.is_number_integer() && r.get<int64_t>() > 0) {
    *replicas = static_cast<int>(std::min<int64_t>(r.get<int64_t>(), 1 << 20));
  }
  // Multi-node (a worker template): each replica is a LeaderWorkerSet group of pods on as many
  // nodes, all mounting the same claims; counted as pods, so that a ReadWriteOnce claim shared
  // by a group is warned about as one shared by replicas is. The group's size as KServe's
  // Parallelism.GetSize() takes it: data / dataLocal, else pipeline, and at least 2.
  if (Field(*scope, "worker").is_object()) {
    const json& par = Field(*scope, "parallelism");
    auto at = [&par](const char* key) -> int64_t {
      const json& v = Field(par, key);
      return v.is_number_integer() ? v.get<int64_t>() : 0;
    };
    int64_t group = 2;
    if (at("data") > 0 && at("dataLocal") > 0) {
      group = std::max<int64_t>(group, at("data") / at("dataLocal"));
    } else if (at("pipeline") > 0) {
      group = std::max<int64_t>(group, at("pipeline"));
    }
    *replicas = static_cast<int>(std::min<int64_t>(*replicas * std::min<int64_t>(group, 1 << 10), 1 << 20));
  }
  // v1alpha2 inlines WorkloadSpec, and KServe renders the pods from spec.kvCacheOffloading:
  // that one first where both are set (a CRD that keeps unknown fields holds both). The docs
  // write spec.workload.kvCacheOffloading.
  const json& inlined = Field(*scope, "kvCacheOffloading");
  if (!inlined.is_null()) return &inlined;
  const json& nested = Field(Field(*scope, "workload"), "kvCacheOffloading");
  if (!nested.is_null()) return &nested;
  return nullptr;
}

Result<ServiceSpec> EffectiveServiceSpec(const json& llmisvc, const std::string& role,
                                         const std::string& namespace_name,
                                         ClusterReader* reader,
                                         const std::string& kserve_namespace) {
  ServiceSpec out;
  // KServe marshals each spec from its Go type and applies the difference from an empty one:
  // cpu (a Quantity without omitempty) always, "0" where unset; evictionPolicy always, the
  // CRD's default lru where unset (the API server stores it); secondary only when it has tiers
  // (omitempty), a null or [] leaving the earlier ones. Other keys merge as JSON.
  auto merge = [&out, &role](const json& object) {
    const json* value = LLMInferenceServiceSpec(object, role, &out.replicas);
    if (value == nullptr) return false;
    if (!value->is_object() || !out.value.is_object()) {
      out.value = *value;
    } else {
      json patch = *value;
      if (!patch.contains("cpu")) patch["cpu"] = "0";
      if (!patch.contains("evictionPolicy") || patch["evictionPolicy"].is_null()) {
        patch["evictionPolicy"] = "lru";
      }
      if (patch.contains("secondary") &&
          (patch["secondary"].is_null() ||
           (patch["secondary"].is_array() && patch["secondary"].empty()))) {
        patch.erase("secondary");
      }
      out.value.merge_patch(patch);
    }
    return true;
  };
  const json& refs = Field(Field(llmisvc, "spec"), "baseRefs");
  const std::string service = StringAt(Field(llmisvc, "metadata"), "name");
  if (!refs.is_null() && !refs.is_array()) {
    return Status::InvalidArgument("spec.baseRefs of LLMInferenceService " + namespace_name + "/" +
                                   service + " is not a list: write [{name: <config>}, ...]");
  }
  if (refs.is_array()) {
    for (size_t i = 0; i < refs.size(); ++i) {
      const std::string name = StringAt(refs[i], "name");
      if (name.empty()) {
        return Status::InvalidArgument(
            "spec.baseRefs[" + std::to_string(i) + "] of LLMInferenceService " + namespace_name +
            "/" + service + " names no LLMInferenceServiceConfig: give it a name, as KServe "
            "renders no pods for the service without one");
      }
      // The name goes into the GET's path: "../../team-b/..." or "x?y" would read another
      // object than the one named. Checked without a reader too, so that apply time says so.
      if (!IsDns1123Subdomain(name)) {
        return Status::InvalidArgument(
            "spec.baseRefs[" + std::to_string(i) + "].name of LLMInferenceService " +
            namespace_name + "/" + service + " is " + QuotedName(name) +
            ", which is no LLMInferenceServiceConfig name: write the config's metadata.name "
            "(lowercase letters, digits, '-' and '.', starting and ending with a letter or "
            "digit, at most 253 characters)");
      }
      if (reader == nullptr) continue;
      std::optional<json> config;
      std::string found_in;
      for (const std::string& ns : {namespace_name, kserve_namespace}) {
        const ObjectRef at{ObjectKind::kLLMInferenceServiceConfig, ns, name};
        Result<std::optional<json>> got = reader->Get(at);
        if (!got.ok()) {
          return CouldNotRead(at, got.status());
        }
        if (got->has_value()) {
          config = std::move(**got);
          found_in = ns;
          break;
        }
        if (ns == kserve_namespace) break;  // the service lives in KServe's namespace
      }
      if (!config) {
        if (!reader->Authoritative()) {
          out.missing.push_back(name);
          continue;
        }
        return Status::InvalidArgument(
            "LLMInferenceServiceConfig \"" + name + "\" (spec.baseRefs of LLMInferenceService " +
            namespace_name + "/" + service + ") is in neither namespace " + namespace_name +
            " nor " + kserve_namespace + " (--kserve-namespace); KServe renders no pods for "
            "this service until it exists");
      }
      if (merge(*config)) out.configs.push_back(found_in + "/" + name);
    }
  }
  merge(llmisvc);
  return out;
}

Result<std::map<std::string, PvcInfo>> LookupPvcs(const OffloadSpec& spec,
                                                  const std::string& namespace_name,
                                                  ClusterReader* reader) {
  std::map<std::string, PvcInfo> pvcs;
  for (const Tier& tier : spec.secondary) {
    if (tier.kind != TierKind::kPvcRef || pvcs.count(tier.ref_name) > 0) continue;
    const ObjectRef ref{ObjectKind::kPersistentVolumeClaim, namespace_name, tier.ref_name};
    Result<std::optional<json>> pvc = reader->Get(ref);
    if (!pvc.ok()) {
      return CouldNotRead(ref, pvc.status());
    }
    if (pvc->has_value()) {
      pvcs[tier.ref_name] = ReadPvc(**pvc);
    } else if (reader->Authoritative()) {
      pvcs[tier.ref_name] = PvcInfo{};  // exists = false: the mutator denies, naming it
    }
  }
  return pvcs;
}

Result<Resolution> Resolve(const JsonView& pod, const std::string& namespace_name,
                           ClusterReader* reader, const std::string& kserve_namespace) {
  Resolution res;
  const JsonView annotations = pod["metadata"]["annotations"];
  const JsonView labels = pod["metadata"]["labels"];

  if (const std::string text = StringAt(annotations, kAnnotationConfig); !text.empty()) {
    res.source = SpecSource::PodAnnotation();
    Result<OffloadSpec> spec = ParseSpecText(text, res.source);
    if (!spec.ok()) return spec.status();
    res.spec = std::move(*spec);
  }

  const KServePod kserve = KServePodKind(labels);
  // KServe's router scheduler and other non-workload pods run no vLLM: only their own
  // annotation gives them a spec.
  if (!res.spec && kserve == KServePod::kOther) return res;
  if (!res.spec && reader != nullptr && kserve == KServePod::kWorkload) {
    const std::string name = StringAt(labels, "app.kubernetes.io/name");
    // Only a valid object name can name a service; anything else would go into the GET's
    // path as written ("llama?x=1" read team-a/llama, "../../team-b/..." another namespace).
    // Like a service that does not exist, it leaves the pod to the namespace default.
    if (IsDns1123Subdomain(name)) {
      const ObjectRef ref{ObjectKind::kLLMInferenceService, namespace_name, name};
      Result<std::optional<json>> svc = reader->Get(ref);
      if (!svc.ok()) {
        return CouldNotRead(ref, svc.status());
      }
      if (svc->has_value()) {
        Result<ServiceSpec> merged = EffectiveServiceSpec(
            **svc, KServeRole(labels), namespace_name, reader, kserve_namespace);
        if (!merged.ok()) return merged.status();
        if (!merged->value.is_null()) {
          res.source = SpecSource::LLMInferenceService(namespace_name, name, merged->configs);
          Result<OffloadSpec> spec = ParseSpecFrom(merged->value, res.source);
          if (!spec.ok()) return spec.status();
          res.spec = std::move(*spec);
          res.replicas = merged->replicas;
        }
      }
    }
  }

  if (!res.spec && reader != nullptr) {
    const ObjectRef ref{ObjectKind::kNamespace, namespace_name, namespace_name};
    Result<std::optional<json>> ns = reader->Get(ref);
    if (!ns.ok()) {
      return CouldNotRead(ref, ns.status());
    }
    if (ns->has_value()) {
      const std::string text =
          StringAt(Field(Field(**ns, "metadata"), "annotations"), kAnnotationDefaultConfig);
      if (!text.empty()) {
        res.source = SpecSource::NamespaceDefault(namespace_name);
        Result<OffloadSpec> spec = ParseSpecText(text, res.source);
        if (!spec.ok()) return spec.status();
        res.spec = std::move(*spec);
      }
    }
  }

  if (!res.spec || reader == nullptr) return res;
  Result<std::map<std::string, PvcInfo>> pvcs = LookupPvcs(*res.spec, namespace_name, reader);
  if (!pvcs.ok()) return pvcs.status();
  res.pvcs = std::move(*pvcs);
  return res;
}

Result<Resolution> Resolve(const json& pod, const std::string& namespace_name,
                           ClusterReader* reader, const std::string& kserve_namespace) {
  return Resolve(JsonDocument::Of(pod).Root(), namespace_name, reader, kserve_namespace);
}

}  // namespace kvoffload::webhook
