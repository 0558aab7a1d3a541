// The kvCacheOffloading spec (KServe LLMInferenceService field): parsed, validated and
// normalised. Pure functions; thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_SPEC_H_
#define KVOFFLOAD_WEBHOOK_SPEC_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"
#include "webhook/quantity.h"

namespace kvoffload::webhook {

// Where a spec came from; every denial names it so users know which object to fix.
struct SpecSource {
  enum class Kind { kPodAnnotation, kLLMInferenceService, kNamespaceDefault, kCommandLine };
  Kind kind = Kind::kPodAnnotation;
  std::string description;  // "pod annotation kvoffload.io/config", "LLMInferenceService ns/name"

  static SpecSource PodAnnotation();
  // `configs`: the LLMInferenceServiceConfigs (spec.baseRefs, "<ns>/<name>") merged under it.
  static SpecSource LLMInferenceService(const std::string& ns, const std::string& name,
                                        const std::vector<std::string>& configs = {});
  static SpecSource NamespaceDefault(const std::string& ns);
  static SpecSource CommandLine();
};

enum class TierKind { kEmptyDir, kPvcSpec, kPvcRef };
// The names used in KVOFFLOAD_TIERS and the docs.
const char* TierKindName(TierKind kind);

struct Tier {
  TierKind kind = TierKind::kEmptyDir;
  Quantity size;             // emptyDir: size; pvc.spec: resources.requests.storage; ref: unset
  nlohmann::json pvc_spec;   // pvc.spec, as given
  std::string ref_name;      // pvc.ref.name
  std::string ref_path;      // pvc.ref.path ("" = the volume root)
};

struct OffloadSpec {
  Quantity cpu;
  std::string eviction_policy;  // webhook/eviction_policies.h; "" = unset (lru)
  std::vector<Tier> secondary;

  // A canonical JSON form: quantities canonicalised, fields in a fixed order. Two specs that
  // mean the same have the same canonical form (the config hash is taken over it).
  nlohmann::json Canonical() const;
};

struct FieldError {
  std::string path;  // "kvCacheOffloading.secondary[1].fileSystem.pvc.ref.name"
  std::string message;
};

// Validates `spec` (the value of kvCacheOffloading). On success errors is empty.
struct SpecParse {
  OffloadSpec spec;
  std::vector<FieldError> errors;
};
SpecParse ParseSpec(const nlohmann::json& spec);

// "kvCacheOffloading from <source> is invalid: <path>: <message>; ..." for a denial.
std::string FormatSpecErrors(const std::vector<FieldError>& errors, const SpecSource& source);

// Parses and validates; InvalidArgument with FormatSpecErrors' message on failure.
Result<OffloadSpec> ParseSpecFrom(const nlohmann::json& spec, const SpecSource& source);

// Parses an annotation value holding the spec as JSON text, then validates it.
Result<OffloadSpec> ParseSpecText(const std::string& text, const SpecSource& source);

// DNS-1123 subdomain (PVC names): lowercase alphanumerics, '-' and '.', at most 253 characters.
bool IsDns1123Subdomain(const std::string& name);
// DNS-1123 label (namespace names): the same without dots, at most 63 characters.
bool IsDns1123Label(const std::string& name);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_SPEC_H_
