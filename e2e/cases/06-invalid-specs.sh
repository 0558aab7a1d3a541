# shellcheck shell=bash
# Case 6: invalid specs are denied with the design's messages, naming the field and the source,
# as kubectl shows them; nothing is stored.
ns="$(case_ns e2e-invalid)"
new_ns "${ns}" kvoffload.io/injection=enabled
n=0
expect_denied() { # SPEC_JSON MESSAGE...
  local spec="$1"; shift
  n=$((n + 1))
  local p msg
  p="$(pod_manifest "bad-${n}" "$(jq -nc --arg s "${spec}" '{"kvoffload.io/config":$s}')")"
  msg="$(create_denied "${ns}" "${p}")"
  echo "  ${spec}"
  echo "    -> ${msg}"
  assert_contains "${msg}" 'admission webhook "namespace.webhook.kvoffload.io" denied the request' "kubectl's denial line"
  assert_contains "${msg}" "annotation" "denial names the source"
  for m in "$@"; do assert_contains "${msg}" "${m}" "denial of ${spec}"; done
}
expect_denied '{"secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"}}}]}' \
  "cpu must be set when secondary tiers are configured"
expect_denied '{"cpu":"lots"}' "kvCacheOffloading.cpu" "lots"
expect_denied '{"cpu":"0"}' "kvCacheOffloading.cpu"
expect_denied '{"cpu":"1Gi","evictionPolicy":"LRU"}' "kvCacheOffloading.evictionPolicy" "LRU"
expect_denied '{"cpu":"1Gi","secondary":[{}]}' \
  "kvCacheOffloading.secondary[0]" "only fileSystem tiers are supported; fileSystem must be set"
expect_denied '{"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"},"pvc":{"ref":{"name":"x"}}}}]}' \
  "kvCacheOffloading.secondary[0].fileSystem" "exactly one of emptyDir or pvc must be set; multiple are set"
expect_denied '{"cpu":"1Gi","secondary":[{"fileSystem":{}}]}' \
  "exactly one of emptyDir or pvc must be set"
expect_denied '{"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{}}}]}' \
  "kvCacheOffloading.secondary[0].fileSystem.pvc" "exactly one of spec or ref must be set"
expect_denied '{"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"1Gi"}}},{"fileSystem":{"pvc":{"ref":{}}}}]}' \
  "kvCacheOffloading.secondary[1].fileSystem.pvc.ref.name" "name is required"
expect_denied '{"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"Bad_Name"}}}}]}' \
  "kvCacheOffloading.secondary[0].fileSystem.pvc.ref.name" "Bad_Name"
expect_denied '{"cpu":"1Gi","secondary":[{"fileSystem":{"pvc":{"ref":{"name":"ok","path":"../up"}}}}]}' \
  "kvCacheOffloading.secondary[0].fileSystem.pvc.ref.path"
expect_denied '{"cpu":"1Gi","secondary":[{"fileSystem":{"emptyDir":{"size":"100Gx"}}}]}' \
  "kvCacheOffloading.secondary[0].fileSystem.emptyDir.size" "100Gx"
# The CPU tier must fit in the container's memory limit (64Gi in pod_manifest).
expect_denied '{"cpu":"64Gi"}' "kvCacheOffloading.cpu"
assert_eq "0" "$(k -n "${ns}" get pods -o json | jq '.items | length')" "pods stored after denials"
