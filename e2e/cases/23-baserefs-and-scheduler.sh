# shellcheck shell=bash
# Case 23: what KServe really renders around an LLMInferenceService, against the real API
# server and the webhook's real RBAC. The offloading spec of an LLMInferenceServiceConfig named
# in spec.baseRefs (one in KServe's namespace, one in the service's, which has none of its own)
# is merged as KServe merges it; a config found nowhere is a denial naming it; and the
# router's scheduler pod, which carries the service's part-of and name labels, is left alone.
ns="$(case_ns e2e-baserefs)"
new_ns "${ns}" kvoffload.io/injection=enabled
k get namespace kserve >/dev/null 2>&1 || k create namespace kserve >/dev/null
shared="kv-tiers-${ns}"
k apply -f - >/dev/null <<YAML
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceServiceConfig
metadata: {name: ${shared}, namespace: kserve}
spec:
  kvCacheOffloading:
    cpu: 8Gi
    evictionPolicy: lru
    secondary: [{fileSystem: {emptyDir: {size: 20Gi}}}]
---
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceServiceConfig
metadata: {name: team-policy, namespace: ${ns}}
spec:
  kvCacheOffloading: {cpu: 6Gi, evictionPolicy: arc}
---
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: based, namespace: ${ns}}
spec:
  baseRefs: [{name: ${shared}}, {name: team-policy}]
YAML
workload='{"app.kubernetes.io/name":"based","app.kubernetes.io/part-of":"llminferenceservice","app.kubernetes.io/component":"llminferenceservice-workload","kserve.io/component":"workload"}'
create_pod "${ns}" "$(pod_manifest based-kserve-0 '{}' "${workload}")" >/dev/null
pod="$(get_pod "${ns}" based-kserve-0)"
assert_injected_once "${pod}" 1
main="$(container "${pod}" main)"
assert_eq "6442450944" "$(env_of "${main}" KVOFFLOAD_CPU_BYTES)" "cpu: the later config's"
assert_eq "arc" "$(env_of "${main}" KVOFFLOAD_EVICTION_POLICY)" "evictionPolicy: the later config's"
assert_eq "20Gi" "$(jqv "${pod}" '.spec.volumes[] | select(.name == "kv-cache-secondary-0") | .emptyDir.sizeLimit')" "tier from the config in KServe's namespace"
status="$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]')"
assert_eq "LLMInferenceService ${ns}/based with LLMInferenceServiceConfig kserve/${shared}, ${ns}/team-policy" "$(jqv "${status}" .source)" "status source"

# A config that exists nowhere: KServe renders no pods for the service; one that comes anyway
# is refused, naming the config and both namespaces.
k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: orphan}
spec:
  baseRefs: [{name: no-such-config}]
YAML
orphan="${workload//\"based\"/\"orphan\"}"
out="$(create_denied "${ns}" "$(pod_manifest orphan-kserve-0 '{}' "${orphan}")")"
assert_contains "${out}" "LLMInferenceServiceConfig \"no-such-config\"" "denial names the config"
assert_contains "${out}" "neither namespace ${ns} nor kserve" "denial names both namespaces"

# The router's scheduler pod: same part-of and name labels, another component.
scheduler='{"app.kubernetes.io/name":"based","app.kubernetes.io/part-of":"llminferenceservice","app.kubernetes.io/component":"llminferenceservice-router-scheduler"}'
create_pod "${ns}" "$(pod_manifest based-kserve-router-scheduler-0 '{}' "${scheduler}")" >/dev/null
assert_not_injected "$(get_pod "${ns}" based-kserve-router-scheduler-0)"
k -n kserve delete llminferenceserviceconfig "${shared}" >/dev/null
