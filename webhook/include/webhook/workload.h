// Where the pod templates of workload kinds live, and how many pods a workload runs. Shared by
// offline `inject`/`validate` and the validating webhook, so both see the same templates.
// Pure functions; thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_WORKLOAD_H_
#define KVOFFLOAD_WEBHOOK_WORKLOAD_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvoffload::webhook {

// JSON pointers of the pod templates in `doc`: {""} for a Pod (the object itself), the template
// pointers for Deployment, StatefulSet, ReplicaSet, DaemonSet, Job, CronJob and LeaderWorkerSet
// (its leader template only when present), {} for any other kind.
std::vector<std::string> PodTemplatePointers(const nlohmann::json& doc);

// How many pods the workload runs at once (at least 1); only "more than one" matters (RWO
// warnings). DaemonSets count as 2: one per node is always more than one.
int WorkloadReplicas(const nlohmann::json& doc);

// "Deployment ns/name" (generateName when there is no name), for messages.
std::string DescribeObject(const nlohmann::json& doc, const std::string& namespace_name);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_WORKLOAD_H_
