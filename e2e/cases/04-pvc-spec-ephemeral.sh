# shellcheck shell=bash
# Case 4: a pvc.spec tier becomes a generic ephemeral volume; the ephemeral-volume controller
# creates PVC <pod>-kv-cache-secondary-<i> owned by the pod, and deleting the pod deletes it.
ns="$(case_ns e2e-ephemeral)"
new_ns "${ns}" kvoffload.io/injection=enabled
spec='{"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"}}},{"fileSystem":{"pvc":{"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"7Gi"}}}}}}]}'
create_pod "${ns}" "$(pod_manifest eph "$(jq -nc --arg s "${spec}" '{"kvoffload.io/config":$s}')")" >/dev/null
pod="$(get_pod "${ns}" eph)"
assert_injected_once "${pod}" 2
uid="$(jqv "${pod}" .metadata.uid)"
pvc_name=eph-kv-cache-secondary-1
wait_until 60 "PVC ${pvc_name} from the ephemeral-volume controller" k -n "${ns}" get pvc "${pvc_name}"
pvc="$(k -n "${ns}" get pvc "${pvc_name}" -o json)"
assert_eq "Pod/eph/${uid}/true" "$(jq -r '.metadata.ownerReferences[0] | "\(.kind)/\(.name)/\(.uid)/\(.controller)"' <<<"${pvc}")" "PVC owner"
assert_eq "7Gi" "$(jqv "${pvc}" .spec.resources.requests.storage)" "PVC size"
assert_eq "1" "$(jqv "${pvc}" '.metadata.labels["kvoffload.io/tier"]')" "PVC tier label"
# Only the pvc.spec tier gets a PVC.
assert_eq "1" "$(k -n "${ns}" get pvc -o json | jq '.items | length')" "PVCs in the namespace"

k -n "${ns}" delete pod eph --wait=false >/dev/null
pvc_gone() { ! k -n "${ns}" get pvc "${pvc_name}" >/dev/null 2>&1; }
wait_until 90 "garbage collection of ${pvc_name} after its pod was deleted" pvc_gone
