# shellcheck shell=bash
# Case 2: a pod labelled kvoffload.io/inject=true with its spec in the kvoffload.io/config
# annotation, in a namespace without the injection label (the second webhook entry).
ns="$(case_ns e2e-annotation)"
new_ns "${ns}"
spec='{"cpu":"2Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"5Gi"}}}]}'
p="$(pod_manifest annotated "$(jq -nc --arg s "${spec}" '{"kvoffload.io/config":$s,"kvoffload.io/vllm":"true"}')" \
  '{"kvoffload.io/inject":"true"}')"
create_pod "${ns}" "${p}" >/dev/null
pod="$(get_pod "${ns}" annotated)"
assert_injected_once "${pod}" 1
main="$(container "${pod}" main)"
assert_eq "2147483648" "$(env_of "${main}" KVOFFLOAD_CPU_BYTES)" "KVOFFLOAD_CPU_BYTES"
assert_eq "5Gi" "$(jqv "${main}" '.resources.requests["ephemeral-storage"]')" "ephemeral-storage request"
assert_eq "5Gi" "$(jqv "${pod}" '.spec.volumes[] | select(.name == "kv-cache-secondary-0") | .emptyDir.sizeLimit')" "sizeLimit"
[[ -n "$(kv_transfer_config "${pod}")" ]] || fail "annotation kvoffload.io/vllm=true: vLLM receives no flag"
assert_contains "$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]' | jq -r .source)" "annotation" "status source"
