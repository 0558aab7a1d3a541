# shellcheck shell=bash
# Case 3: a plain pod in a labelled namespace takes the namespace's kvoffload.io/default-config;
# a pod annotation still wins over it; a KServe pod whose LLMInferenceService has no spec of its
# own takes the default too, and vLLM receives our flag through KServe's launch script.
ns="$(case_ns e2e-nsdefault)"
new_ns "${ns}" kvoffload.io/injection=enabled
k annotate namespace "${ns}" \
  'kvoffload.io/default-config={"cpu":"1Gi","evictionPolicy":"arc","secondary":[{"fileSystem":{"emptyDir":{"size":"3Gi"}}}]}' >/dev/null
create_pod "${ns}" "$(pod_manifest plain)" >/dev/null
pod="$(get_pod "${ns}" plain)"
assert_injected_once "${pod}" 1
main="$(container "${pod}" main)"
assert_eq "1073741824" "$(env_of "${main}" KVOFFLOAD_CPU_BYTES)" "cpu from the namespace default"
assert_eq "arc" "$(env_of "${main}" KVOFFLOAD_EVICTION_POLICY)" "policy from the namespace default"
assert_contains "$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]' | jq -r .source)" "namespace" "status source"

create_pod "${ns}" "$(pod_manifest override '{"kvoffload.io/config":"{\"cpu\":\"3Gi\"}"}')" >/dev/null
pod="$(get_pod "${ns}" override)"
assert_eq "3221225472" "$(env_of "$(container "${pod}" main)" KVOFFLOAD_CPU_BYTES)" "pod annotation wins over the namespace default"

k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata:
  name: nospec
spec:
  model: {uri: "hf://Qwen/Qwen3-0.6B", name: "Qwen/Qwen3-0.6B"}
YAML
create_pod "${ns}" "$(pod_manifest nospec-kserve-0 '{}' \
  '{"app.kubernetes.io/name":"nospec","app.kubernetes.io/part-of":"llminferenceservice"}')" >/dev/null
pod="$(get_pod "${ns}" nospec-kserve-0)"
assert_injected_once "${pod}" 1
assert_contains "$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]' | jq -r .source)" "namespace" "KServe pod: status source"
assert_eq "KVOffloadAgentSpec" "$(jqv "$(kv_transfer_config "${pod}")" .kv_connector_extra_config.spec_name)" "KServe pod, namespace default: vLLM receives the agent spec"
