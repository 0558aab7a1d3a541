# shellcheck shell=bash
# Case 34 (needs this run's node): the GitOps path. `kv-offload-webhook inject`, offline and told
# nothing about the PVC of a pvc.ref tier, writes the tier's capacityBytes as 0 (and warns); the
# injected pod is then created in a namespace the webhook does not select, so what runs is
# inject's output alone. The agent must size that tier from the file system mounted there, keep
# it under that size and serve its blocks back. The PVC is bound to a hostPath volume on a
# 16 MiB tmpfs: the agent takes 16 MiB less the webhook's headroom, min(size/2, 8 MiB +
# size/64), which is 8 MiB. Until the agent read the 0, vLLM's start failed on it.
# kind's nodes are containers that do not see this run's mounts: there the case is skipped.
need_node
if [[ "${E2E_CLUSTER}" != node ]]; then
  echo "the tmpfs behind the PersistentVolume is mounted where this run's own node sees it"
  exit 77
fi
ns="$(case_ns e2e-offline-inject)"
new_ns "${ns}"
disk="$(mktemp -d "${E2E_STATE}/pv.XXXXXX")"
mount -t tmpfs -o size=16m tmpfs "${disk}"
# The namespace's mounts go with the node's; unmounting here keeps a rerun's state tidy.
trap 'umount -l "${disk}" 2>/dev/null || true' EXIT

pv="kv-offload-e2e-$(basename "${disk}" | tr 'A-Z.' 'a-z-')"
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata:
  name: ${pv}
spec:
  capacity: {storage: 16Mi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {path: ${disk}, type: Directory}
  claimRef: {namespace: ${ns}, name: kv-cache}
YAML
k -n "${ns}" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: kv-cache
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: ${pv}
  resources: {requests: {storage: 16Mi}}
YAML
bound() { [[ "$(k -n "${ns}" get pvc kv-cache -o jsonpath='{.status.phase}')" == Bound ]]; }
wait_until 60 "PVC kv-cache to bind to ${pv}" bound

linger=5
spec='{"cpu":"4Mi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv-cache","path":"kv-cache/"}}}}]}'
input="$(standin_pod offline standin agent "${linger}" \
  | jq --arg spec "${spec}" '.metadata.annotations["kvoffload.io/config"] = $spec')"
webhook="${E2E_WEBHOOK_BIN:-${E2E_REPO}/build/webhook/kv-offload-webhook}"
warnings="${E2E_STATE}/offline-inject.warnings"
injected="$("${webhook}" inject -f - --namespace "${ns}" --default-mode=agent \
  --agent-image="${E2E_AGENT_IMAGE}" <<<"${input}" 2>"${warnings}")" \
  || fail "inject refused the pod: $(cat "${warnings}")"
grep -q "PVC kv-cache was not checked" "${warnings}" \
  || fail "inject did not warn that it could not check the PVC: $(cat "${warnings}")"
tiers="$(env_of "$(container "${injected}" main)" KVOFFLOAD_TIERS)"
assert_eq '[0]' "$(jq -c '[.[].capacityBytes]' <<<"${tiers}")" "capacityBytes inject wrote for the unread PVC"

pod="$(create_pod "${ns}" "${injected}")"
assert_eq "${tiers}" "$(env_of "$(container "${pod}" main)" KVOFFLOAD_TIERS)" \
  "KVOFFLOAD_TIERS as stored (the webhook left the unselected namespace alone)"
finished() { [[ "$(pod_phase "${ns}" offline)" == Succeeded/* || "$(pod_phase "${ns}" offline)" == Failed/* ]]; }
wait_until $((linger + 120)) "pod offline to finish" finished
phase="$(pod_phase "${ns}" offline)"
echo "pod offline: ${phase}"
result="$(standin_result "${ns}" offline)"
echo "stand-in result: ${result}"
[[ -n "${result}" ]] || fail "no KVOFFLOAD-E2E-RESULT line: $(k -n "${ns}" logs offline -c main | tail -n 5)"
assert_eq "Succeeded/" "${phase}" "pod phase/reason"
assert_eq "[]" "$(jq -c .failures <<<"${result}")" "the stand-in's checks (each tier used, under its capacity, blocks read back)"
assert_eq '[{"capacityBytes":8388608,"path":"/mnt/kv-cache-0"}]' "$(jq -cS .tiers <<<"${result}")" \
  "the tier as the agent sized it: 16 MiB less 8 MiB of headroom"
assert_eq 0 "$(jq .corrupt <<<"${result}")" "blocks that loaded different bytes"
k -n "${ns}" delete pod offline --wait=false >/dev/null
