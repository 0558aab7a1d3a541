// Finds a pod's kvCacheOffloading spec (first match wins: pod annotation, owning
// LLMInferenceService, namespace default) and the facts the mutator needs about it (pvc.ref
// PVCs, replicas). All I/O goes through a ClusterReader. Thread-safe if the reader is.
#ifndef KVOFFLOAD_WEBHOOK_RESOLVER_H_
#define KVOFFLOAD_WEBHOOK_RESOLVER_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"
#include "webhook/cluster_reader.h"
#include "webhook/mutator.h"
#include "webhook/spec.h"

namespace kvoffload::webhook {

struct Resolution {
  std::optional<OffloadSpec> spec;  // nullopt: no spec anywhere; the pod is left alone
  SpecSource source;
  int replicas = 1;
  std::map<std::string, PvcInfo> pvcs;  // pvc.ref PVCs that were checked
};

// `reader` may be null: then only the pod annotation is consulted and PVCs are not checked.
// Errors: InvalidArgument for an invalid spec (deny with its message), Unavailable when a
// lookup could not be answered.
Result<Resolution> Resolve(const JsonView& pod, const std::string& namespace_name,
                           ClusterReader* reader,
                           const std::string& kserve_namespace = kDefaultKServeNamespace);
// The same for a pod held as an nlohmann value (tests, and callers that build one).
Result<Resolution> Resolve(const nlohmann::json& pod, const std::string& namespace_name,
                           ClusterReader* reader,
                           const std::string& kserve_namespace = kDefaultKServeNamespace);

// The spec's pvc.ref PVCs as `reader` knows them: found ones with their facts, missing ones
// with exists = false when the reader is authoritative, left out otherwise (not checked).
// Unavailable when a lookup could not be answered.
Result<std::map<std::string, PvcInfo>> LookupPvcs(const OffloadSpec& spec,
                                                  const std::string& namespace_name,
                                                  ClusterReader* reader);

// The kvCacheOffloading value in an LLMInferenceService, or an LLMInferenceServiceConfig, for
// a pod of `role` (llm-d.ai/role): spec.kvCacheOffloading, else spec.workload.kvCacheOffloading,
// under spec.prefill for prefill. `replicas` is set where the object sets it.
const nlohmann::json* LLMInferenceServiceSpec(const nlohmann::json& llmisvc,
                                              const std::string& role, int* replicas);

// What a pod of `role` gets from an LLMInferenceService, as KServe renders it: the value of
// each LLMInferenceServiceConfig its spec.baseRefs names, in order, each merged over the ones
// before (objects key by key, lists and scalars replaced, as Kubernetes' strategic merge does
// for fields without a patch strategy), then the service's own over them. Each config is looked
// up in the service's namespace, then in `kserve_namespace`, as KServe looks. With no reader,
// the service's own alone.
struct ServiceSpec {
  nlohmann::json value;              // the merged kvCacheOffloading; null: none anywhere
  int replicas = 1;
  std::vector<std::string> configs;  // "<ns>/<name>" of the configs that gave a part of it
  // Names of configs found nowhere, where the reader is not authoritative (offline, or at
  // apply time, when the config may come next): skipped.
  std::vector<std::string> missing;
};
// InvalidArgument (a denial) when a spec.baseRefs entry has no valid name (checked with no
// reader too), or a named config is in neither namespace (KServe renders no pods for such a
// service); Unavailable when a lookup could not be answered.
Result<ServiceSpec> EffectiveServiceSpec(const nlohmann::json& llmisvc, const std::string& role,
                                         const std::string& namespace_name,
                                         ClusterReader* reader,
                                         const std::string& kserve_namespace);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_RESOLVER_H_
