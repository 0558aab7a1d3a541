# shellcheck shell=bash
# Case 30 (needs a node): an LLMInferenceService's pod, shaped and launched as KServe renders it,
# runs with the agent the webhook injected. The init container installs /opt/kvoffload from the
# agent image; the main container (the stand-in image: Python and bash, no vLLM, no kvoffload of
# its own) imports kvoffload and loads libkvoffload from there through the injected env, stores
# more blocks than the CPU tier holds so that they cascade through both mounted emptyDir tiers,
# finds and loads every block still held and compares its bytes. It stays up for several of the
# kubelet's volume measurements: the agent keeps each tier under its capacity, so the kubelet,
# which evicts a pod whose emptyDir passes its sizeLimit (case 31), leaves it alone. The pod ends
# Succeeded. Its main container has limits.cpu 1, and the agent's host device (no GPU here) copies
# on one worker thread, as the cgroup runc made allows, not one per core of the node.
#
# Tier sizes (E2E_AGENT_TIER_SIZES, default "16Mi 24Mi"): the kubelet's measurement counts the
# tier's folders too, not only the block files. With capacityBytes equal to the sizeLimit, 16Mi
# of the stand-in's 260 KiB files left 4 KiB and this pod was evicted; the webhook now keeps
# headroom under the sizeLimit (docs/decisions.md), and these sizes are the ones that failed.
need_node
read -r size0 size1 <<<"${E2E_AGENT_TIER_SIZES:-16Mi 24Mi}"
ns="$(case_ns e2e-agent-pod)"
new_ns "${ns}" kvoffload.io/injection=enabled
k -n "${ns}" apply -f - >/dev/null <<YAML
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata:
  name: standin
spec:
  kvCacheOffloading:
    cpu: "4Mi"
    evictionPolicy: lru
    secondary:
      - fileSystem:
          emptyDir:
            size: "${size0}"
      - fileSystem:
          emptyDir:
            size: "${size1}"
YAML
linger=25
create_pod "${ns}" "$(standin_pod agent standin agent "${linger}" \
  | jq '.spec.containers[0].resources.limits.cpu = "1"')" >/dev/null
pod="$(get_pod "${ns}" agent)"
assert_injected_once "${pod}" 2
assert_eq "kvoffload-agent-install" "$(jqv "${pod}" '.spec.initContainers[0].name')" "agent install init container"
assert_eq "${E2E_AGENT_IMAGE}" "$(jqv "${pod}" '.spec.initContainers[0].image')" "agent image"

finished() { [[ "$(pod_phase "${ns}" agent)" == Succeeded/* || "$(pod_phase "${ns}" agent)" == Failed/* ]]; }
wait_until $((linger + 120)) "pod agent to finish" finished
phase="$(pod_phase "${ns}" agent)"
echo "pod agent: ${phase}"
k -n "${ns}" logs agent -c kvoffload-agent-install
result="$(standin_result "${ns}" agent)"
echo "stand-in result: ${result}"
assert_eq "Succeeded/" "${phase}" "pod phase/reason (Evicted would mean the agent overfilled a tier)"
[[ -n "${result}" ]] || fail "no KVOFFLOAD-E2E-RESULT line in the main container's log"
assert_eq "[]" "$(jq -c .failures <<<"${result}")" "the stand-in's checks"
assert_eq "/opt/kvoffload/python/kvoffload" "$(jqv "${result}" .package)" "kvoffload imported from the agent volume"
assert_eq "/opt/kvoffload/lib/libkvoffload.so" "$(jqv "${result}" .library)" "libkvoffload loaded from the agent volume"
assert_eq '["/mnt/kv-cache-0","/mnt/kv-cache-1"]' "$(jq -c '[.tiers[].path]' <<<"${result}")" "tiers the agent used"
for t in 0 1 2; do
  (($(jq --arg t "${t}" '.perTier[$t]' <<<"${result}") > 0)) || fail "no block found in tier ${t}: ${result}"
done
assert_eq 0 "$(jq .corrupt <<<"${result}")" "blocks that loaded different bytes"
engine="$(jqv "${result}" .engine)"
[[ "${engine}" == *"copies on 1 worker threads"* ]] \
  || fail "the host device's copy pool under limits.cpu 1 is not one thread: ${engine}"
# The flag: the webhook puts it in args for this pod (KServe's launch script passes them to
# vllm), and exactly that one reached the stand-in `vllm` through the script. (Checked only as
# far as the pod carried one, before: a pod left without the flag passed.)
main="$(container "${pod}" main)"
assert_eq "args" "$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"] | fromjson | .vllmFlag')" "where the webhook put the flag"
# (The launch script itself mentions the flag: only args count.)
assert_eq 1 "$(jq '[(.args // [])[] | select(test("^--kv[-_]transfer[-_]config"))] | length' <<<"${main}")" "--kv-transfer-config in the stored args"
assert_eq 1 "$(jq '.kvTransferConfigs | length' <<<"${result}")" "--kv-transfer-config received by vllm"
assert_eq "KVOffloadAgentSpec" "$(jqv "${result}" '.kvTransferConfigs[0].kv_connector_extra_config.spec_name')" "spec_name received by vllm"
