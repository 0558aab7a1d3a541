# shellcheck shell=bash
# Case 3: a plain pod in a labelled namespace takes the namespace's kvoffload.io/default-config;
# a pod annotation still wins over it.
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
