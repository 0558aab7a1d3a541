#include "webhook/workload.h"

#include <algorithm>
#include <cstdint>

#include "webhook/json_util.h"

namespace kvoffload::webhook {

using nlohmann::json;

std::vector<std::string> PodTemplatePointers(const json& doc) {
  const std::string kind = StringAt(doc, "kind");
  if (kind == "Pod") return {""};
  if (kind == "Deployment" || kind == "StatefulSet" || kind == "ReplicaSet" ||
      kind == "DaemonSet" || kind == "Job") {
    return {"/spec/template"};
  }
  if (kind == "CronJob") return {"/spec/jobTemplate/spec/template"};
  if (kind == "LeaderWorkerSet") {
    std::vector<std::string> out{"/spec/leaderWorkerTemplate/workerTemplate"};
    if (doc.contains(json::json_pointer("/spec/leaderWorkerTemplate/leaderTemplate"))) {
      out.emplace_back("/spec/leaderWorkerTemplate/leaderTemplate");
    }
    return out;
  }
  return {};
}

int WorkloadReplicas(const json& doc) {
  const std::string kind = StringAt(doc, "kind");
  auto int_at = [&doc](const char* pointer, int64_t fallback) {
    const json::json_pointer p(pointer);
    return doc.contains(p) && doc[p].is_number_integer() ? doc[p].get<int64_t>() : fallback;
  };
  int64_t n = 1;
  if (kind == "Deployment" || kind == "StatefulSet" || kind == "ReplicaSet") {
    n = int_at("/spec/replicas", 1);
  }
  if (kind == "Job") n = int_at("/spec/parallelism", 1);
  if (kind == "DaemonSet") n = 2;
  if (kind == "LeaderWorkerSet") {
    n = int_at("/spec/replicas", 1) * int_at("/spec/leaderWorkerTemplate/size", 1);
  }
  return static_cast<int>(std::clamp<int64_t>(n, 1, 1 << 20));
}

std::string DescribeObject(const json& doc, const std::string& namespace_name) {
  const json no_metadata;
  const json& meta = doc.is_object() && doc.contains("metadata") ? doc["metadata"] : no_metadata;
  std::string name = StringAt(meta, "name");
  if (name.empty()) name = StringAt(meta, "generateName");
  std::string kind = StringAt(doc, "kind");
  if (kind.empty()) kind = "object";
  // Cluster-scoped objects (Namespace) have no namespace to show.
  if (kind == "Namespace") return kind + " " + name;
  return kind + " " + namespace_name + "/" + name;
}

}  // namespace kvoffload::webhook
