# shellcheck shell=bash
# Case 31 (needs a node), the control for case 30: the same injected pod whose main container
# writes twice its first emptyDir tier's capacity into it, as a cache that ignores capacity
# would. The kubelet measures the volume, finds it past the sizeLimit the webhook set, and
# evicts the pod: the node enforces the limit that case 30's agent stays under.
need_node
ns="$(case_ns e2e-evict)"
new_ns "${ns}" kvoffload.io/injection=enabled
k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata:
  name: standin
spec:
  kvCacheOffloading:
    cpu: "4Mi"
    secondary:
      - fileSystem:
          emptyDir:
            size: "16Mi"
YAML
create_pod "${ns}" "$(standin_pod writer standin fill 300)" >/dev/null
assert_eq "16Mi" "$(jqv "$(get_pod "${ns}" writer)" '.spec.volumes[] | select(.name == "kv-cache-secondary-0") | .emptyDir.sizeLimit')" "emptyDir sizeLimit"
t0=${SECONDS}
evicted() { [[ "$(pod_phase "${ns}" writer)" == Failed/Evicted ]]; }
# kind's kubelet measures volumes every minute (this node's every 2 s).
wait_until 240 "pod writer to be evicted" evicted
echo "evicted $((SECONDS - t0))s after creation"
msg="$(k -n "${ns}" get pod writer -o jsonpath='{.status.message}')"
echo "kubelet: ${msg}"
assert_contains "${msg}" "kv-cache-secondary-0" "eviction message names the tier volume"
