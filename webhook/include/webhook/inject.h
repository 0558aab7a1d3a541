// Offline injection for GitOps (like `istioctl kube-inject`): reads Pods and workloads
// (Deployment, StatefulSet, ReplicaSet, DaemonSet, Job, CronJob, LeaderWorkerSet) as YAML or
// JSON, possibly several documents, and prints them with the same patch the webhook would
// apply. Other documents pass through unchanged; LLMInferenceService, Namespace and PVC
// documents in the same input are used to resolve specs. `validate` runs the apply-time checks
// (webhook/validation.h) over every document. Thread-safe (no shared state).
#ifndef KVOFFLOAD_WEBHOOK_INJECT_H_
#define KVOFFLOAD_WEBHOOK_INJECT_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"
#include "webhook/mutator.h"
#include "webhook/validation.h"

namespace kvoffload::webhook {

struct InjectOptions {
  Mode default_mode = Mode::kVllmNative;
  std::string agent_image;
  std::string namespace_name = "default";  // for documents without metadata.namespace
  std::optional<nlohmann::json> config;    // --config: the spec when no other source has one
  std::string kserve_namespace = kDefaultKServeNamespace;  // where shared baseRefs configs live
};

struct InjectResult {
  std::string output;                 // same format as the input (YAML or JSON)
  std::vector<std::string> warnings;  // "Deployment ns/name: <warning>"
};

// One input of several (the files of a directory): read together, so that an
// LLMInferenceService in one file resolves the spec of a workload in another, as `kubectl
// apply -f DIR` would create them in one cluster. `name` prefixes the file's parse errors.
struct ManifestFile {
  std::string name;
  std::string text;
};

// Validates every document first: InvalidArgument on unparseable input, or with one line per
// error of every document ("Deployment ns/name: spec.template: <denial>") when any is invalid.
// The warnings are those of the apply-time checks.
Result<InjectResult> InjectManifests(std::string_view input, const InjectOptions& options);
// Several files: the output is one YAML stream of all their documents, in order (a single
// JSON file keeps its format, as above).
Result<InjectResult> InjectManifests(const std::vector<ManifestFile>& files,
                                     const InjectOptions& options);

// The apply-time checks of every object in the input that holds a spec of ours (documents with
// none are left out). InvalidArgument only for unparseable input.
Result<std::vector<ObjectReport>> ValidateManifests(std::string_view input,
                                                    const InjectOptions& options);
Result<std::vector<ObjectReport>> ValidateManifests(const std::vector<ManifestFile>& files,
                                                    const InjectOptions& options);

// YAML (1.2 core schema: plain scalars typed, quoted ones strings) to JSON, all documents.
Result<std::vector<nlohmann::ordered_json>> ParseYamlDocuments(std::string_view text);
// JSON to block YAML; strings that would read back as another type are quoted.
std::string EmitYaml(const nlohmann::ordered_json& doc);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_INJECT_H_
