# shellcheck shell=bash
# Case 5: a pvc.ref naming a PVC that does not exist is denied, naming it; once the PVC exists
# the same pod is admitted.
ns="$(case_ns e2e-pvcref)"
new_ns "${ns}" kvoffload.io/injection=enabled
spec='{"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv-later","path":"cache"}}}}]}'
p="$(pod_manifest refpod "$(jq -nc --arg s "${spec}" '{"kvoffload.io/config":$s}')")"
msg="$(create_denied "${ns}" "${p}")"
assert_contains "${msg}" "denied the request" "kubectl message"
assert_contains "${msg}" "kv-later" "denial names the missing PVC"
assert_contains "${msg}" "kvCacheOffloading.secondary[0].fileSystem.pvc.ref" "denial names the field"
k -n "${ns}" get pod refpod >/dev/null 2>&1 && fail "denied pod was stored"

k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: kv-later
spec:
  accessModes: ["ReadWriteOnce"]
  resources:
    requests:
      storage: 1Gi
YAML
# Not-found answers are never cached, so the very next create is admitted.
k -n "${ns}" create -f - <<<"${p}" >/dev/null || fail "pod denied right after PVC kv-later was created"
pod="$(get_pod "${ns}" refpod)"
assert_injected_once "${pod}" 1
assert_eq "kv-later" "$(jqv "${pod}" '.spec.volumes[] | select(.name == "kv-cache-secondary-0") | .persistentVolumeClaim.claimName')" "claimName"
assert_eq "cache" "$(jqv "$(container "${pod}" main)" '.volumeMounts[] | select(.name == "kv-cache-secondary-0") | .subPath')" "subPath"
