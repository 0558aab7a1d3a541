#include "webhook/cluster_reader.h"

#include "webhook/json_util.h"

namespace kvoffload::webhook {

const char* ObjectKindName(ObjectKind kind) {
  switch (kind) {
    case ObjectKind::kLLMInferenceService: return "LLMInferenceService";
    case ObjectKind::kNamespace: return "Namespace";
    case ObjectKind::kPersistentVolumeClaim: return "PersistentVolumeClaim";
    case ObjectKind::kLLMInferenceServiceConfig: return "LLMInferenceServiceConfig";
  }
  return "Unknown";
}

std::string ObjectRef::ToString() const {
  if (kind == ObjectKind::kNamespace) return std::string("Namespace ") + name;
  return std::string(ObjectKindName(kind)) + " " + namespace_name + "/" + name;
}

StaticClusterReader::StaticClusterReader(const std::vector<nlohmann::json>& objects,
                                         const std::string& default_namespace, bool authoritative)
    : authoritative_(authoritative) {
  for (const nlohmann::json& obj : objects) {
    const std::string kind = StringAt(obj, "kind");
    const nlohmann::json& meta = obj.contains("metadata") ? obj["metadata"] : nlohmann::json();
    const std::string name = StringAt(meta, "name");
    std::string ns = StringAt(meta, "namespace");
    if (ns.empty()) ns = default_namespace;
    if (kind == "LLMInferenceService") {
      objects_[{ObjectKind::kLLMInferenceService, ns, name}] = obj;
    } else if (kind == "LLMInferenceServiceConfig") {
      objects_[{ObjectKind::kLLMInferenceServiceConfig, ns, name}] = obj;
    } else if (kind == "Namespace") {
      objects_[{ObjectKind::kNamespace, name, name}] = obj;
    } else if (kind == "PersistentVolumeClaim") {
      objects_[{ObjectKind::kPersistentVolumeClaim, ns, name}] = obj;
    }
  }
}

Result<std::optional<nlohmann::json>> StaticClusterReader::GetBefore(const ObjectRef& ref, Deadline) {
  auto it = objects_.find(ref);
  if (it == objects_.end()) return std::optional<nlohmann::json>();
  return std::optional<nlohmann::json>(it->second);
}

}  // namespace kvoffload::webhook
