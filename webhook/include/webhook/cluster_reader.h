// Read access to the few cluster objects the webhook consults (LLMInferenceService and the
// LLMInferenceServiceConfigs it names, Namespace, PersistentVolumeClaim), behind one interface so the resolver is tested with objects in
// memory and served with the API server. Implementations must be thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_CLUSTER_READER_H_
#define KVOFFLOAD_WEBHOOK_CLUSTER_READER_H_

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

enum class ObjectKind {
  kLLMInferenceService,
  kNamespace,
  kPersistentVolumeClaim,
  kLLMInferenceServiceConfig,  // a service's spec.baseRefs (KServe merges them under its spec)
};
inline constexpr size_t kObjectKinds = 4;

// KServe's own namespace, where LLMInferenceServiceConfigs that every namespace may name live
// (its controller's POD_NAMESPACE; `kserve` upstream). --kserve-namespace.
inline constexpr char kDefaultKServeNamespace[] = "kserve";
const char* ObjectKindName(ObjectKind kind);

struct ObjectRef {
  ObjectKind kind;
  std::string namespace_name;  // the namespace itself for kNamespace
  std::string name;
  std::string ToString() const;  // "LLMInferenceService team-a/llama"
  friend bool operator<(const ObjectRef& a, const ObjectRef& b) {
    return std::tie(a.kind, a.namespace_name, a.name) < std::tie(b.kind, b.namespace_name, b.name);
  }
};

using Deadline = std::chrono::steady_clock::time_point;

class ClusterReader {
 public:
  virtual ~ClusterReader() = default;
  // The object; std::nullopt when it does not exist; an error when the answer is unknown
  // (unreachable, timeout, 5xx, forbidden, or not known by `deadline`).
  virtual Result<std::optional<nlohmann::json>> GetBefore(const ObjectRef& ref,
                                                          Deadline deadline) = 0;
  // Without a deadline of its own: the offline commands, and lookups made through a
  // BudgetReader, which supplies one.
  Result<std::optional<nlohmann::json>> Get(const ObjectRef& ref) {
    return GetBefore(ref, Deadline::max());
  }
  // False when a missing object proves nothing (offline inject sees only the given manifests),
  // so a missing PVC is "not checked" rather than "not found".
  virtual bool Authoritative() const = 0;
};

// One admission's view of a reader: all of its lookups share one deadline, so an admission that
// needs several (LLMInferenceService, then Namespace, then each pvc.ref PVC) answers within its
// budget however slow the API server is, instead of spending a timeout on each.
class BudgetReader final : public ClusterReader {
 public:
  // `inner` is not owned and must outlive this object.
  BudgetReader(ClusterReader* inner, Deadline deadline) : inner_(inner), deadline_(deadline) {}
  Result<std::optional<nlohmann::json>> GetBefore(const ObjectRef& ref,
                                                  Deadline deadline) override {
    return inner_->GetBefore(ref, std::min(deadline, deadline_));
  }
  bool Authoritative() const override { return inner_->Authoritative(); }

 private:
  ClusterReader* const inner_;
  const Deadline deadline_;
};

// Objects held in memory: `inject` fills it from the documents it reads, tests from fixtures.
// Immutable after construction, hence thread-safe.
class StaticClusterReader final : public ClusterReader {
 public:
  // Keeps LLMInferenceService(Config), Namespace and PersistentVolumeClaim objects; ignores
  // the rest.
  // Objects without a namespace get `default_namespace`.
  StaticClusterReader(const std::vector<nlohmann::json>& objects,
                      const std::string& default_namespace, bool authoritative);
  Result<std::optional<nlohmann::json>> GetBefore(const ObjectRef& ref, Deadline) override;
  bool Authoritative() const override { return authoritative_; }

 private:
  std::map<ObjectRef, nlohmann::json> objects_;
  bool authoritative_;
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_CLUSTER_READER_H_
