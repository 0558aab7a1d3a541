# shellcheck shell=bash
# Case 22: the pod templates of Deployments, StatefulSets and Jobs whose pods would be injected
# are checked when the workload is applied, with the denial their pods would get (prefixed with
# the template's field path): a Deployment applied at 0 replicas no longer hides a bad spec until
# it is scaled. Templates whose pods are not injected (opt-out label; unlabelled namespace
# without the pod opt-in label) are left alone. Valid templates get the pod warnings at apply.
lab="$(case_ns e2e-workloads)"
plain="$(case_ns e2e-workloads-plain)"
new_ns "${lab}" kvoffload.io/injection=enabled
new_ns "${plain}"

# workload KIND NAME REPLICAS SPEC_JSON [TEMPLATE_LABELS_JSON] [MEMORY_LIMIT]: a workload whose
# pod template carries SPEC_JSON as its kvoffload.io/config annotation.
workload() {
  local kind="$1" name="$2" replicas="$3" spec="$4" labels="${5:-}" memory="${6:-64Gi}"
  [[ -n "${labels}" ]] || labels='{}'
  jq -n --arg kind "${kind}" --arg name "${name}" --argjson replicas "${replicas}" \
    --arg spec "${spec}" --argjson labels "${labels}" --arg memory "${memory}" '
    {metadata: {labels: ({app: $name} + $labels), annotations: {"kvoffload.io/config": $spec}},
     spec: {nodeSelector: {"e2e.kvoffload.io/never-scheduled": "true"},
            containers: [{name: "main", image: "vllm/vllm-openai:v0.22.0", command: ["vllm", "serve"],
                          resources: {limits: {memory: $memory}}}]}} as $template
    | if $kind == "Job" then
        {apiVersion: "batch/v1", kind: "Job", metadata: {name: $name},
         spec: {parallelism: $replicas, template: ($template | .spec.restartPolicy = "Never")}}
      else
        {apiVersion: "apps/v1", kind: $kind, metadata: {name: $name},
         spec: ({replicas: $replicas, selector: {matchLabels: {app: $name}}, template: $template}
                + (if $kind == "StatefulSet" then {serviceName: $name} else {} end))}
      end'
}
# refused NS MANIFEST [kubectl args...]: expects a denial; prints kubectl's message.
refused() {
  local ns="$1" manifest="$2" out; shift 2
  if out="$(k -n "${ns}" apply "$@" -f - <<<"${manifest}" 2>&1)"; then fail "admitted, expected a denial: ${out}"; fi
  printf '%s\n' "${out}"
}
bad='{"cpu":"1Gi","evictionPolicy":"fifo"}'
pod_errors='kvCacheOffloading from pod annotation kvoffload.io/config is invalid: kvCacheOffloading.evictionPolicy: "fifo" is not supported: use one of arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo (agent mode) or arc, lru (vllm-native mode); names are lowercase'

# The issue's case: applied but not scaled. Refused, dry-run too, nothing stored.
for mode in server-dry-run apply; do
  args=()
  [[ "${mode}" == server-dry-run ]] && args+=(--dry-run=server)
  out="$(refused "${lab}" "$(workload Deployment idle 0 "${bad}")" "${args[@]}")"
  echo "Deployment (${mode}): ${out}"
  assert_contains "${out}" 'admission webhook "workloads.namespace.validate.kvoffload.io" denied the request: spec.template: '"${pod_errors}" "Deployment denial"
done
if k -n "${lab}" get deployment idle >/dev/null 2>&1; then fail "the refused Deployment was stored"; fi
# Word for word what its pods would be refused with.
pod_msg="$(create_denied "${lab}" "$(pod_manifest p "$(jq -nc --arg s "${bad}" '{"kvoffload.io/config":$s}')")")"
assert_contains "${pod_msg}" "denied the request: ${pod_errors}" "pod-time denial"

out="$(refused "${lab}" "$(workload StatefulSet st 1 '{"cpu":"64Gi"}')")"
echo "StatefulSet: ${out}"
assert_contains "${out}" "spec.template: kvCacheOffloading.cpu: 64Gi does not fit in container \"main\"'s memory limit 64Gi" "StatefulSet denial"
out="$(refused "${lab}" "$(workload Job jb 1 '{"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"1Gx"}}}]}')")"
echo "Job: ${out}"
assert_contains "${out}" 'spec.template: kvCacheOffloading from pod annotation kvoffload.io/config is invalid: kvCacheOffloading.secondary[0].fileSystem.emptyDir.size: "1Gx" is not a valid quantity' "Job denial"

# Not ours: opted out in a labelled namespace; unlabelled namespace without the pod opt-in.
k -n "${lab}" apply --dry-run=server -f - >/dev/null <<<"$(workload Deployment optout 0 "${bad}" '{"kvoffload.io/inject":"false"}')" \
  || fail "an opted-out template was refused"
k -n "${plain}" apply --dry-run=server -f - >/dev/null <<<"$(workload Deployment plain 0 "${bad}")" \
  || fail "a template in an unlabelled namespace without the opt-in label was refused"
out="$(refused "${plain}" "$(workload Deployment optin 0 "${bad}" '{"kvoffload.io/inject":"true"}')" --dry-run=server)"
assert_contains "${out}" 'admission webhook "workloads.object.validate.kvoffload.io" denied the request: spec.template: ' "opt-in template in an unlabelled namespace"

# Valid but likely wrong: warnings at apply. A ReadWriteOnce PVC shared by 3 replicas; a CPU tier
# over 80% of the memory limit.
k -n "${lab}" apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: kv-rwo}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
YAML
out="$(k -n "${lab}" apply --dry-run=server -f - 2>&1 <<<"$(workload Deployment shared 3 '{"cpu":"9Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"kv-rwo"}}}}]}' '' 10Gi)")" \
  || fail "a valid Deployment was refused: ${out}"
echo "warnings: ${out}"
assert_contains "${out}" "Warning: PVC kv-rwo is not ReadWriteMany but the workload has 3 replicas" "RWO warning"
assert_contains "${out}" "Warning: kvCacheOffloading.cpu 9Gi is over 80% of container main's memory limit 10Gi" "CPU tier warning"

# Stored valid, then updated to a bad spec: refused; the stored one stays.
k -n "${lab}" apply -f - >/dev/null <<<"$(workload Deployment good 0 '{"cpu":"1Gi"}')" || fail "a valid Deployment was refused"
out="$(refused "${lab}" "$(workload Deployment good 0 "${bad}")")"
assert_contains "${out}" "spec.template: ${pod_errors}" "update denial"
assert_eq '{"cpu":"1Gi"}' "$(k -n "${lab}" get deployment good -o json | jq -r '.spec.template.metadata.annotations["kvoffload.io/config"]')" "stored template"
