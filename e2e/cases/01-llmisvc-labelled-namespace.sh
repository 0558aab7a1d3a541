# shellcheck shell=bash
# Case 1: a pod rendered for an LLMInferenceService in a labelled namespace is stored with every
# injected part: tier volumes (emptyDir, ephemeral PVC, pre-existing PVC), mounts, the
# ephemeral-storage request, env, the vLLM flag, the status annotation; and in agent mode (the
# webhook's default) the agent volume, its install init container and the library env.
ns="$(case_ns e2e-llmisvc)"
new_ns "${ns}" kvoffload.io/injection=enabled
k -n "${ns}" apply -f "${E2E_REPO}/examples/pvc.yaml" >/dev/null
k -n "${ns}" apply -f "${E2E_REPO}/examples/llminferenceservice.yaml" >/dev/null
# vllm-native asked for by annotation (agent is the webhook's default, checked below).
pod="$(k annotate --local -o json -f "${E2E_REPO}/examples/kserve-rendered-pod.yaml" \
         kvoffload.io/mode=vllm-native | k -n "${ns}" create -f - -o json 2>&1)" \
  || fail "pod refused: ${pod}"
# Check what was stored, not what create answered.
pod="$(get_pod "${ns}" qwen3-kserve-demo)"
assert_injected_once "${pod}" 3
main="$(container "${pod}" main)"

assert_eq "100Gi" "$(jqv "${pod}" '.spec.volumes[] | select(.name == "kv-cache-secondary-0") | .emptyDir.sizeLimit')" "emptyDir sizeLimit"
vct="$(jq -c '.spec.volumes[] | select(.name == "kv-cache-secondary-1") | .ephemeral.volumeClaimTemplate' <<<"${pod}")"
assert_eq "1" "$(jqv "${vct}" '.metadata.labels["kvoffload.io/tier"]')" "ephemeral PVC tier label"
assert_eq "200Gi" "$(jqv "${vct}" '.spec.resources.requests.storage')" "ephemeral PVC size"
assert_eq "my-kv-cache-pvc" "$(jqv "${pod}" '.spec.volumes[] | select(.name == "kv-cache-secondary-2") | .persistentVolumeClaim.claimName')" "pvc.ref claimName"
assert_eq "kv-cache/" "$(jqv "${main}" '.volumeMounts[] | select(.name == "kv-cache-secondary-2") | .subPath')" "pvc.ref subPath"
assert_eq "100Gi" "$(jqv "${main}" '.resources.requests["ephemeral-storage"]')" "ephemeral-storage request"

assert_eq "10737418240" "$(env_of "${main}" KVOFFLOAD_CPU_BYTES)" "KVOFFLOAD_CPU_BYTES"
assert_eq "lru" "$(env_of "${main}" KVOFFLOAD_EVICTION_POLICY)" "KVOFFLOAD_EVICTION_POLICY"
tiers="$(env_of "${main}" KVOFFLOAD_TIERS)"
assert_eq '["/mnt/kv-cache-0","/mnt/kv-cache-1","/mnt/kv-cache-2"]' "$(jq -c '[.[].path]' <<<"${tiers}")" "tier paths"
# The RWX pre-existing PVC is a shared tier: hashing must be stable across processes.
assert_eq "0" "$(env_of "${main}" PYTHONHASHSEED)" "PYTHONHASHSEED with a shared tier"

# KServe's launch script renders its own flag; ours, in args, is the one vLLM gets.
cfg="$(kv_transfer_config "${pod}")"
[[ -n "${cfg}" ]] || fail "vLLM receives no --kv-transfer-config: $(jq -c .args <<<"${main}")"
assert_eq "OffloadingConnector" "$(jqv "${cfg}" .kv_connector)" "kv_connector"
assert_eq "kv_both" "$(jqv "${cfg}" .kv_role)" "kv_role"
assert_eq "TieringOffloadingSpec" "$(jqv "${cfg}" .kv_connector_extra_config.spec_name)" "spec_name (vllm-native)"
assert_eq "10737418240" "$(jqv "${cfg}" .kv_connector_extra_config.cpu_bytes_to_use)" "cpu_bytes_to_use"
assert_eq '["/mnt/kv-cache-0","/mnt/kv-cache-1","/mnt/kv-cache-2"]' "$(jq -c '[.kv_connector_extra_config.secondary_tiers[].root_dir]' <<<"${cfg}")" "secondary_tiers"
assert_eq "args" "$(jqv "$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]')" .vllmFlag)" "status vllmFlag"

status="$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]')"
assert_contains "$(jqv "${status}" .source)" "qwen3" "status source names the LLMInferenceService"
assert_eq "vllm-native" "$(jqv "${status}" .mode)" "status mode"
assert_eq "" "$(jqv "${pod}" '.spec.initContainers[]? | select(.name == "kvoffload-agent-install") | .name')" "no agent init container in vllm-native mode"

# Agent mode by default (no mode annotation).
k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata:
  name: agentic
spec:
  kvCacheOffloading:
    cpu: "4Gi"
    evictionPolicy: arc
    secondary:
      - fileSystem:
          emptyDir:
            size: "10Gi"
YAML
p2="$(pod_manifest agentic-kserve-0 '{}' \
  '{"app.kubernetes.io/name":"agentic","app.kubernetes.io/part-of":"llminferenceservice"}')"
create_pod "${ns}" "${p2}" >/dev/null
p2="$(get_pod "${ns}" agentic-kserve-0)"
assert_injected_once "${p2}" 1
m2="$(container "${p2}" main)"
assert_eq "arc" "$(env_of "${m2}" KVOFFLOAD_EVICTION_POLICY)" "eviction policy from the spec"
assert_eq "4294967296" "$(env_of "${m2}" KVOFFLOAD_CPU_BYTES)" "cpu bytes from the spec"
init="$(jq -c '.spec.initContainers[]? | select(.name == "kvoffload-agent-install")' <<<"${p2}")"
[[ -n "${init}" ]] || fail "agent mode: no kvoffload-agent-install init container"
[[ -n "$(jqv "${init}" .image)" ]] || fail "agent init container has no image"
assert_eq 1 "$(jq '[.spec.volumes[] | select(.name == "kvoffload-agent" and .emptyDir != null)] | length' <<<"${p2}")" "agent emptyDir volume"
assert_eq "/opt/kvoffload" "$(jqv "${m2}" '.volumeMounts[] | select(.name == "kvoffload-agent") | .mountPath')" "agent mount"
assert_eq "true" "$(jqv "${m2}" '.volumeMounts[] | select(.name == "kvoffload-agent") | .readOnly')" "agent mount read-only"
assert_eq "/opt/kvoffload/lib/libkvoffload.so" "$(env_of "${m2}" KVOFFLOAD_LIBRARY)" "KVOFFLOAD_LIBRARY"
assert_eq "11" "$(env_of "${m2}" VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)" "vLLM's wait for its workers: the write-back's time"
assert_contains "$(env_of "${m2}" PYTHONPATH)" "/opt/kvoffload/python" "PYTHONPATH"
assert_eq "KVOffloadAgentSpec" "$(jqv "$(kv_transfer_config "${p2}")" .kv_connector_extra_config.spec_name)" "agent spec_name"
assert_eq "agent" "$(jqv "$(jqv "${p2}" '.metadata.annotations["kvoffload.io/status"]')" .mode)" "status mode (the default)"

# KServe's sample writes spec.workload.kvCacheOffloading, and v1alpha1 has no kvCacheOffloading
# at all: KServe's CRD keeps neither. kubectl (strict field validation by default) refuses
# them, naming the field; a client that does not ask for validation (client-go's default) has
# them dropped without a word (`validate` warns), and the service's pods run without offloading.
dropped="$(cat <<'YAML'
apiVersion: serving.kserve.io/v1alpha1
kind: LLMInferenceService
metadata:
  name: dropped
spec:
  workload:
    kvCacheOffloading: {cpu: "4Gi"}
  kvCacheOffloading: {cpu: "4Gi"}
YAML
)"
out="$(k -n "${ns}" apply -f - <<<"${dropped}" 2>&1)" && fail "kubectl stored fields KServe's CRD does not have: ${out}"
assert_contains "${out}" 'unknown field "spec.workload"' "kubectl names the field"
k -n "${ns}" apply --validate=false -f - <<<"${dropped}" >/dev/null
assert_eq "{}" "$(k -n "${ns}" get llminferenceservice dropped -o json | jq -c '.spec')" "what the API server keeps of the v1alpha1 spec"
create_pod "${ns}" "$(pod_manifest dropped-kserve-0 '{}' \
  '{"app.kubernetes.io/name":"dropped","app.kubernetes.io/part-of":"llminferenceservice"}')" >/dev/null
assert_not_injected "$(get_pod "${ns}" dropped-kserve-0)"

# KServe's P/D pods pass NixlConnector themselves, in VLLM_ADDITIONAL_ARGS: ours follows it as
# one MultiConnector with theirs first, in the same variable, and vLLM (the launch run by bash
# with a stand-in vllm) gets theirs, then that, and takes the later.
k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata:
  name: pd
spec:
  kvCacheOffloading: {cpu: "2Gi"}
  prefill:
    kvCacheOffloading: {cpu: "2Gi"}
YAML
nixl='--kv_transfer_config '\''{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'\'
decode="$(pod_manifest pd-kserve-0 '{}' \
  '{"app.kubernetes.io/name":"pd","app.kubernetes.io/part-of":"llminferenceservice","llm-d.ai/role":"decode"}' |
  jq -c --arg v "${nixl}" '.spec.containers[0].env += [{name: "VLLM_ADDITIONAL_ARGS", value: $v}]')"
create_pod "${ns}" "${decode}" >/dev/null
decode="$(get_pod "${ns}" pd-kserve-0)"
assert_eq "NixlConnector" "$(jqv "$(jqv "${decode}" '.metadata.annotations["kvoffload.io/status"]')" .vllmFlagBeside)" "status: ours beside theirs"
got="$(vllm_receives "${decode}")"
assert_eq '["NixlConnector","MultiConnector"]' "$(jq -c '[.[].kv_connector]' <<<"${got}")" "vLLM gets theirs, then ours"
assert_eq '["NixlConnector","OffloadingConnector"]' "$(jq -c '[.[1].kv_connector_extra_config.connectors[].kv_connector]' <<<"${got}")" "the MultiConnector runs theirs first"
assert_eq "KVOffloadAgentSpec" "$(jq -r '.[1].kv_connector_extra_config.connectors[1].kv_connector_extra_config.spec_name' <<<"${got}")" "ours second, in agent mode"
