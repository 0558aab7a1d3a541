# shellcheck shell=bash
# Case 20: an LLMInferenceService with a bad kvCacheOffloading spec is refused when it is applied
# (server-side dry-run too): by KServe's CRD schema where it says so, else by the webhook, every
# error with its field path and in the pod denial's words, at spec and spec.prefill; nothing is
# stored. A valid one is stored, with admission warnings for what is likely wrong (a missing or
# RWO-shared PVC, a CPU tier close to the memory limit); an update to a bad spec is refused. With the checks'
# endpoint unreachable an apply still passes: the shipped entries use failurePolicy Ignore.
ns="$(case_ns e2e-llmisvc-apply)"
# No injection label: LLMInferenceServices are checked in every namespace (KServe renders tiers).
new_ns "${ns}"
seed="$(cat "${E2E_REPO}/examples/llminferenceservice.yaml")"
# What KServe's CRD schema itself refuses (a quantity's pattern, the policy's enum) never
# reaches the webhook: the API server answers first, in its own words.
out="$(k -n "${ns}" apply -f - 2>&1 <<<"$(sed 's/cpu: "10Gi"/cpu: "ten"/; s/evictionPolicy: lru/evictionPolicy: fifo/' <<<"${seed}")")" \
  && fail "the CRD schema let cpu \"ten\" and policy fifo through: ${out}"
echo "schema: ${out}"
assert_contains "${out}" 'spec.kvCacheOffloading.evictionPolicy: Unsupported value: "fifo"' "the CRD's enum"
assert_contains "${out}" 'spec.kvCacheOffloading.cpu' "the CRD's quantity pattern"
[[ "${out}" != *"specs.validate.kvoffload.io"* ]] || fail "the webhook was asked about what the schema refuses: ${out}"

# What the schema lets through and the webhook refuses: a zero CPU tier, a PVC name that is no
# DNS-1123 name.
bad="$(sed 's/cpu: "10Gi"/cpu: "0"/; s/name: my-kv-cache-pvc/name: Bad_Name/' <<<"${seed}")"
[[ "${bad}" == *'cpu: "0"'* && "${bad}" == *"name: Bad_Name"* ]] || fail "could not break the seed example"

for mode in server-dry-run apply; do
  args=(apply -f -)
  [[ "${mode}" == server-dry-run ]] && args+=(--dry-run=server)
  out="$(k -n "${ns}" "${args[@]}" <<<"${bad}" 2>&1)" && fail "${mode}: a bad spec was accepted: ${out}"
  echo "${mode}: ${out}"
  assert_contains "${out}" 'admission webhook "specs.validate.kvoffload.io" denied the request' "${mode}: kubectl's denial line"
  assert_contains "${out}" "kvCacheOffloading from LLMInferenceService ${ns}/qwen3 is invalid: " "${mode}: the pod denial's opening"
  assert_contains "${out}" 'spec.kvCacheOffloading.cpu: must be greater than 0' "${mode}: cpu error"
  assert_contains "${out}" 'spec.kvCacheOffloading.secondary[2].fileSystem.pvc.ref.name: "Bad_Name"' "${mode}: PVC name error"
done

# The prefill path, all errors in one answer.
out="$(k -n "${ns}" apply -f - 2>&1 <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: pd}
spec:
  kvCacheOffloading: {cpu: "0"}
  prefill:
    kvCacheOffloading:
      cpu: 1Gi
      secondary: [{fileSystem: {pvc: {ref: {name: Bad_Name}}}}]
YAML
)" && fail "prefill: a bad spec was accepted: ${out}"
echo "prefill: ${out}"
assert_contains "${out}" 'spec.kvCacheOffloading.cpu: must be greater than 0' "spec path"
assert_contains "${out}" 'spec.prefill.kvCacheOffloading.secondary[0].fileSystem.pvc.ref.name: "Bad_Name"' "prefill path"
assert_eq "0" "$(k -n "${ns}" get llminferenceservices -o json | jq '.items | length')" "services stored after denials"

# The seed example as it is: stored, with a warning that its pre-existing PVC is not there yet.
out="$(k -n "${ns}" apply -f - <<<"${seed}" 2>&1)" || fail "the seed example was refused: ${out}"
echo "seed: ${out}"
assert_contains "${out}" "Warning: PVC my-kv-cache-pvc not found in namespace ${ns}: its pods are denied until it exists" "missing PVC warning"
assert_contains "${out}" "llminferenceservice.serving.kserve.io/qwen3 created" "seed stored"

# Updates are checked against the service's own template (memory limit 64Gi).
out="$(k -n "${ns}" patch llminferenceservice qwen3 --type merge -p '{"spec":{"kvCacheOffloading":{"cpu":"64Gi"}}}' 2>&1)" \
  && fail "an update past the memory limit was accepted: ${out}"
echo "update: ${out}"
assert_contains "${out}" "spec.template: kvCacheOffloading.cpu: 64Gi does not fit in container \"main\"'s memory limit 64Gi" "template check on update"
out="$(k -n "${ns}" patch llminferenceservice qwen3 --type merge -p '{"spec":{"kvCacheOffloading":{"cpu":"60Gi"}}}' 2>&1)" \
  || fail "a valid update was refused: ${out}"
assert_contains "${out}" "Warning: kvCacheOffloading.cpu 60Gi is over 80% of container main's memory limit 64Gi" "CPU tier warning"
assert_eq "60Gi" "$(k -n "${ns}" get llminferenceservice qwen3 -o json | jq -r .spec.kvCacheOffloading.cpu)" "stored cpu"

# A ReadWriteOnce PVC referenced by a service of 2 replicas.
k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: kv-rwo}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
YAML
out="$(k -n "${ns}" apply --dry-run=server -f - 2>&1 <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: shared}
spec:
  replicas: 2
  kvCacheOffloading:
    cpu: 1Gi
    secondary: [{fileSystem: {pvc: {ref: {name: kv-rwo}}}}]
YAML
)" || fail "the RWO service was refused: ${out}"
assert_contains "${out}" "Warning: PVC kv-rwo is not ReadWriteMany but the workload has 2 replicas" "RWO warning"

# failurePolicy Ignore: the shipped specs entry, pointed at a port where nothing listens and
# scoped to this namespace. Made live with Fail first (an apply then fails calling it), so the
# admitted apply afterwards shows Ignore at work, not a configuration not yet loaded.
installed="$(k get validatingwebhookconfiguration -o json \
  | jq -c '[.items[] | select(.metadata.name | startswith("kv-offload-webhook"))][0]')"
[[ "$(jqv "${installed}" '.metadata.name')" == kv-offload-webhook* ]] || fail "no installed validating configuration"
assert_eq "Ignore" "$(jq -r '.webhooks[] | select(.name == "specs.validate.kvoffload.io") | .failurePolicy' <<<"${installed}")" "shipped failurePolicy"
k label namespace "${ns}" "e2e.kvoffload.io/down=${ns}" >/dev/null
down="kv-offload-e2e-down-${ns}"
dead_port="$(free_port)"
down_config() { # FAILURE_POLICY
  jq --arg name "${down}" --arg ns "${ns}" --arg url "https://127.0.0.1:${dead_port}/validate" --arg fp "$1" '{
    apiVersion: "admissionregistration.k8s.io/v1", kind: "ValidatingWebhookConfiguration",
    metadata: {name: $name, labels: {"e2e.kvoffload.io/case": "true"}},
    webhooks: [.webhooks[] | select(.name == "specs.validate.kvoffload.io")
               | .name = "down.e2e.kvoffload.io" | .clientConfig.url = $url
               | del(.clientConfig.service)
               | .failurePolicy = (if $fp == "shipped" then .failurePolicy else $fp end)
               | .namespaceSelector = {matchLabels: {"e2e.kvoffload.io/down": $ns}}]}' <<<"${installed}"
}
trap 'k delete validatingwebhookconfiguration "${down}" --ignore-not-found >/dev/null 2>&1' EXIT
down_config Fail | k apply -f - >/dev/null
fails_calling() { ! k -n "${ns}" apply --dry-run=server -f - <<<"${seed}" >/dev/null 2>&1; }
wait_until 30 "the unreachable webhook entry to be called" fails_calling
out="$(k -n "${ns}" apply --dry-run=server -f - <<<"${seed}" 2>&1)" || true
assert_contains "${out}" 'failed calling webhook "down.e2e.kvoffload.io"' "the entry is live and unreachable"
down_config shipped | k apply -f - >/dev/null
admitted() { k -n "${ns}" apply --dry-run=server -f - <<<"${seed}" >/dev/null 2>&1; }
wait_until 30 "an apply admitted while the entry is unreachable (failurePolicy Ignore)" admitted
