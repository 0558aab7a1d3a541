# shellcheck shell=bash
# Case 21: a namespace default spec (annotation kvoffload.io/default-config) is checked when it
# is written: annotating a namespace or creating one with a bad default is refused (dry-run
# too) with the words a pod of that namespace would be refused with; a good one is stored.
ns="$(case_ns e2e-nsdefault-apply)"
new_ns "${ns}" kvoffload.io/injection=enabled
bad='{"cpu":"0","evictionPolicy":"fifo"}'
out="$(k annotate namespace "${ns}" "kvoffload.io/default-config=${bad}" 2>&1)" \
  && fail "a bad namespace default was stored: ${out}"
echo "annotate: ${out}"
assert_contains "${out}" 'admission webhook "specs.validate.kvoffload.io" denied the request' "kubectl's denial line"
assert_contains "${out}" "kvCacheOffloading from namespace ${ns} annotation kvoffload.io/default-config is invalid: kvCacheOffloading.cpu: must be greater than 0" "cpu error"
assert_contains "${out}" 'kvCacheOffloading.evictionPolicy: "fifo" is not supported' "policy error"
assert_eq "" "$(k get namespace "${ns}" -o json | jq -r '.metadata.annotations["kvoffload.io/default-config"] // empty')" "annotation stored"

# A new namespace carrying a bad default, as a GitOps repository would create it.
fresh="$(case_ns e2e-nsdefault-new)"
manifest="$(jq -n --arg name "${fresh}" '{apiVersion: "v1", kind: "Namespace",
  metadata: {name: $name, labels: {"e2e.kvoffload.io/case": "true"},
             annotations: {"kvoffload.io/default-config": "{\"cpu\":\"ten\"}"}}}')"
for mode in server-dry-run create; do
  args=(create -f -)
  [[ "${mode}" == server-dry-run ]] && args+=(--dry-run=server)
  out="$(k "${args[@]}" <<<"${manifest}" 2>&1)" && fail "${mode}: a namespace with a bad default was created: ${out}"
  echo "${mode}: ${out}"
  assert_contains "${out}" "kvCacheOffloading from namespace ${fresh} annotation kvoffload.io/default-config is invalid: kvCacheOffloading.cpu: \"ten\" is not a valid quantity" "${mode}"
done
if k get namespace "${fresh}" >/dev/null 2>&1; then fail "namespace ${fresh} exists after the denial"; fi

# The same words as at pod time: a pod carrying the same spec is refused with the same errors
# (only the source differs).
annotate_msg="$(k annotate namespace "${ns}" "kvoffload.io/default-config=${bad}" 2>&1)" && fail "stored on retry"
pod_msg="$(create_denied "${ns}" "$(pod_manifest p "$(jq -nc --arg s "${bad}" '{"kvoffload.io/config":$s}')")")"
errors_of() { sed -n 's/.* is invalid: //p' <<<"$1"; }
[[ -n "$(errors_of "${pod_msg}")" ]] || fail "no errors in the pod denial: ${pod_msg}"
assert_eq "$(errors_of "${pod_msg}")" "$(errors_of "${annotate_msg}")" "apply-time errors equal pod-time errors"

k annotate namespace "${ns}" 'kvoffload.io/default-config={"cpu":"1Gi"}' >/dev/null || fail "a good default was refused"
assert_eq '{"cpu":"1Gi"}' "$(k get namespace "${ns}" -o json | jq -r '.metadata.annotations["kvoffload.io/default-config"]')" "good default stored"
