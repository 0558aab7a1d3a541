// Apply-time checks of the objects a kvCacheOffloading spec is written in: LLMInferenceServices,
// Namespaces with a default spec, and the pod templates of workloads (and Pods, offline). They
// run the same parsing, resolution and Mutate() as the pod webhook, so an apply is refused with
// the words a pod would be refused with, only earlier. Used by the validating webhook and by the
// offline `validate` and `inject` commands. Thread-safe if the reader is.
#ifndef KVOFFLOAD_WEBHOOK_VALIDATION_H_
#define KVOFFLOAD_WEBHOOK_VALIDATION_H_

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"
#include "webhook/cluster_reader.h"
#include "webhook/mutator.h"

namespace kvoffload::webhook {

struct ValidationOptions {
  Mode default_mode = Mode::kVllmNative;
  std::string agent_image;
  // Workload pods are injected only when their template is labelled kvoffload.io/inject=true
  // (namespaces without the kvoffload.io/injection label); otherwise unless labelled "false".
  bool pods_need_label = false;
  std::optional<nlohmann::json> fallback_config;  // offline --config: the spec when none is found
  std::string kserve_namespace = kDefaultKServeNamespace;
};

struct ObjectReport {
  std::string object;                 // "LLMInferenceService team-a/llama"
  bool checked = false;               // false: the object holds nothing of ours
  std::vector<std::string> errors;    // one per problem, each naming its field path
  std::vector<std::string> warnings;  // valid but likely wrong; each under 120 characters
  std::string denial;                 // every error in one message, worded as the pod denial
};

// Checks `object` (any kind; kinds without a spec of ours come back unchecked). `reader` may be
// null (no lookups). A PVC named by pvc.ref that an authoritative reader does not find is a
// warning here, not an error: it may be applied right after the object naming it, and the pod
// webhook still refuses pods while it is missing. Unavailable when a lookup failed.
Result<ObjectReport> ValidateObject(const nlohmann::json& object, const std::string& namespace_name,
                                    const ValidationOptions& options, ClusterReader* reader);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_VALIDATION_H_
