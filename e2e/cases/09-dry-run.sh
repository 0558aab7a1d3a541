# shellcheck shell=bash
# Case 9: kubectl create --dry-run=server prints the mutated pod and stores nothing
# (the webhook declares sideEffects: None, so the API server calls it for dry-run requests).
ns="$(case_ns e2e-dryrun)"
new_ns "${ns}" kvoffload.io/injection=enabled
k annotate namespace "${ns}" \
  'kvoffload.io/default-config={"cpu":"2Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"4Gi"}}}]}' >/dev/null
out="$(pod_manifest dry | k -n "${ns}" create --dry-run=server -o json -f -)" || fail "dry-run refused: ${out}"
assert_injected_once "${out}" 1
assert_eq "4Gi" "$(jqv "$(container "${out}" main)" '.resources.requests["ephemeral-storage"]')" "dry-run output is mutated"
if k -n "${ns}" get pod dry >/dev/null 2>&1; then fail "dry-run stored the pod"; fi
assert_eq "0" "$(k -n "${ns}" get pods -o json | jq '.items | length')" "pods stored"
