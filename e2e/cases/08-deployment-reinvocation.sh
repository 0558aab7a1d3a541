# shellcheck shell=bash
# Case 8: a Deployment of 3 replicas rendered as KServe would for an LLMInferenceService: each
# pod (created by the ReplicaSet controller, generateName only) is injected exactly once.
# A second, test-only webhook configuration calls the same webhook with reinvocationPolicy
# IfNeeded, so every pod reaches our webhook twice, the second time with our own output.
ns="$(case_ns e2e-deploy)"
new_ns "${ns}" kvoffload.io/injection=enabled "e2e.kvoffload.io/reinvoke=${ns}"
k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata:
  name: llm
spec:
  kvCacheOffloading:
    cpu: "8Gi"
    secondary:
      - fileSystem:
          emptyDir:
            size: "20Gi"
      - fileSystem:
          pvc:
            spec:
              accessModes: ["ReadWriteOnce"]
              resources:
                requests:
                  storage: 50Gi
YAML
extra="kv-offload-e2e-reinvoke-${ns}"
k get mutatingwebhookconfiguration kv-offload-webhook -o json | jq --arg name "${extra}" --arg ns "${ns}" '{
  apiVersion: "admissionregistration.k8s.io/v1", kind: "MutatingWebhookConfiguration",
  metadata: {name: $name, labels: {"e2e.kvoffload.io/case": "true"}},
  webhooks: [.webhooks[0] | .name = "reinvoke.e2e.kvoffload.io" | .reinvocationPolicy = "IfNeeded"
             | .namespaceSelector = {matchLabels: {"e2e.kvoffload.io/reinvoke": $ns}}]}' \
  | k apply -f - >/dev/null
trap 'k delete mutatingwebhookconfiguration "${extra}" --ignore-not-found >/dev/null 2>&1' EXIT
# The new configuration is live when a dry-run pod reaches the webhook twice.
probe_twice() {
  local b a
  b="$(webhook_requests)"
  pod_manifest reinvoke-probe | k -n "${ns}" create --dry-run=server -f - >/dev/null
  a="$(webhook_requests)"
  ((a - b >= 2))
}
wait_until 30 "the second webhook configuration to be served" probe_twice

before="$(webhook_requests)"
# The pod template's main container is KServe's launch script, with KServe's own flag rendered
# from the LLMInferenceService's spec (ours must still be the one vLLM receives).
llm_spec="$(k -n "${ns}" get llminferenceservice llm -o json | jq -c .spec.kvCacheOffloading)"
jq -n --argjson main "$(kserve_main "${llm_spec}")" '{
  apiVersion: "apps/v1", kind: "Deployment", metadata: {name: "llm-kserve"},
  spec: {replicas: 3,
         selector: {matchLabels: {"app.kubernetes.io/name": "llm",
                                  "app.kubernetes.io/part-of": "llminferenceservice"}},
         template: {metadata: {labels: {"app.kubernetes.io/name": "llm",
                                        "app.kubernetes.io/part-of": "llminferenceservice",
                                        "app.kubernetes.io/component": "llminferenceservice-workload",
                                        "kserve.io/component": "workload"}},
                    spec: {nodeSelector: {"e2e.kvoffload.io/never-scheduled": "true"},
                           containers: [$main]}}}}' | k -n "${ns}" apply -f - >/dev/null
three_pods() { [[ "$(k -n "${ns}" get pods -l app.kubernetes.io/name=llm -o json | jq '.items | length')" == 3 ]]; }
wait_until 90 "3 pods from the Deployment's ReplicaSet" three_pods
pods="$(k -n "${ns}" get pods -l app.kubernetes.io/name=llm -o json)"
for i in 0 1 2; do
  pod="$(jq -c ".items[${i}]" <<<"${pods}")"
  name="$(jqv "${pod}" .metadata.name)"
  [[ -n "$(jqv "${pod}" .metadata.generateName)" ]] || fail "${name} was not created from generateName"
  assert_injected_once "${pod}" 2
  main="$(container "${pod}" main)"
  assert_eq "20Gi" "$(jqv "${main}" '.resources.requests["ephemeral-storage"]')" "${name}: ephemeral-storage added once"
  assert_eq 1 "$(vllm_receives "${pod}" | jq length)" "${name}: vLLM receives the flag once"
done
# Every pod's hash is the same: one spec, one configuration.
assert_eq 1 "$(jq '[.items[].metadata.annotations["kvoffload.io/status"] | fromjson | .configHash] | unique | length' <<<"${pods}")" "config hashes across replicas"
after="$(webhook_requests)"
((after - before >= 6)) || fail "expected each of 3 pods to reach the webhook twice, counted $((after - before))"
# Deleting a pod: the ReplicaSet's replacement is injected the same way.
victim="$(jq -r '.items[0].metadata.name' <<<"${pods}")"
k -n "${ns}" delete pod "${victim}" --wait=false >/dev/null
replaced() { k -n "${ns}" get pods -l app.kubernetes.io/name=llm -o json | jq -e --arg v "${victim}" '[.items[] | select(.metadata.name != $v and .metadata.deletionTimestamp == null)] | length == 3' >/dev/null; }
wait_until 60 "a replacement pod" replaced
newest="$(k -n "${ns}" get pods -l app.kubernetes.io/name=llm -o json | jq -c --arg v "${victim}" '[.items[] | select(.metadata.name != $v)] | sort_by(.metadata.creationTimestamp) | last')"
assert_injected_once "${newest}" 2
