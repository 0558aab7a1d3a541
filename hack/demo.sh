#!/usr/bin/env bash
# make demo: the webhook against a real API server on this machine. Starts the local control
# plane (etcd, kube-apiserver, kube-controller-manager built by e2e/controlplane/build.sh) and the
# webhook from BUILD, applies examples/ (a labelled namespace, a PVC, the LLMInferenceService of
# the full example), creates the pod KServe would render for it, and shows what the webhook
# injected. Then keeps everything running for kubectl until Ctrl-C; DEMO_ONCE=1 exits at once.
#   usage: hack/demo.sh [BUILD]     (BUILD defaults to build)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build}"
[[ "${build}" == /* ]] || build="${repo}/${build}"
export E2E_REPO="${repo}"
# shellcheck source=../e2e/lib.sh
source "${repo}/e2e/lib.sh"
# shellcheck source=../e2e/controlplane/local.sh
source "${repo}/e2e/controlplane/local.sh"

state="$(mktemp -d "${TMPDIR:-/tmp}/kvoffload-demo.XXXXXX")"
cleanup() {
  trap - EXIT INT TERM
  echo
  e2e_log "stopping the demo"
  cp_down "${state}"
  rm -rf "${state}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bold() { if [[ -t 1 ]]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }

t0=${SECONDS}
bin="$("${repo}/e2e/controlplane/build.sh" | tail -n1)"
cp_up "${state}" "${bin}"
k apply -f "${repo}/e2e/testdata/llminferenceservice-crd.yaml" >/dev/null
k wait --for condition=Established --timeout 60s crd/llminferenceservices.serving.kserve.io >/dev/null
wh_up "${state}" "${build}/webhook/kv-offload-webhook" "${repo}"
e2e_log "ready in $((SECONDS - t0))s"

bold "== kubectl apply -k examples/"
k apply -k "${repo}/examples"
wait_until 60 "ServiceAccount default in kv-offload-demo" k -n kv-offload-demo get serviceaccount default
bold "== kubectl -n kv-offload-demo create -f examples/kserve-rendered-pod.yaml"
k -n kv-offload-demo create -f "${repo}/examples/kserve-rendered-pod.yaml"

pod="$(k -n kv-offload-demo get pod qwen3-kserve-demo -o json)"
status="$(jq -r '.metadata.annotations["kvoffload.io/status"] // empty' <<<"${pod}")"
[[ -n "${status}" ]] || e2e_die "the pod was not injected (no kvoffload.io/status annotation)"
echo
bold "== What the webhook injected into pod kv-offload-demo/qwen3-kserve-demo (as stored)"
jq -r '
  def qty(q): q // "-";
  "status annotation:  \(.metadata.annotations["kvoffload.io/status"])",
  "",
  "volumes:",
  (.spec.volumes[] | select(.name | startswith("kv-cache-secondary-") or . == "kvoffload-agent") |
    "  \(.name)  " + (
      if .emptyDir then "emptyDir sizeLimit=\(qty(.emptyDir.sizeLimit))"
      elif .ephemeral then "ephemeral PVC \(.ephemeral.volumeClaimTemplate.spec.resources.requests.storage) \(.ephemeral.volumeClaimTemplate.spec.accessModes) labels=\(.ephemeral.volumeClaimTemplate.metadata.labels)"
      elif .persistentVolumeClaim then "existing PVC \(.persistentVolumeClaim.claimName)"
      else tostring end)),
  (.spec.initContainers // [] | .[] | "init container:  \(.name) image=\(.image) command=\(.command)"),
  "",
  (.spec.containers[] | select(.name == "main") |
    "container main:",
    "  mounts:",
    (.volumeMounts // [] | .[] | select(.mountPath | startswith("/mnt/kv-cache-") or startswith("/opt/kvoffload")) |
      "    \(.mountPath) <- \(.name)" + (if .subPath then " subPath=\(.subPath)" else "" end)),
    "  requests: \(.resources.requests)",
    "  env:",
    (.env // [] | .[] | select(.name | startswith("KVOFFLOAD_") or . == "PYTHONHASHSEED" or . == "PYTHONPATH" or . == "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS") |
      "    \(.name)=\(.value)"),
    "  command: \(.command[0:2] // [] | join(" ")) <KServe launch script> \(.command[3:] // [] | join(" "))",
    "  args:",
    (.args // [] | .[] | "    \(.)"))' <<<"${pod}"
# Not read from the pod spec: the patched launch command run as the container runs it (bash and
# KServe's script, with a stand-in vllm that records its argv), so this is what vLLM receives.
echo
bold "== What vLLM receives when the stored pod's launch command runs (hack/vllm_argv.py)"
received="$(python3 "${repo}/hack/vllm_argv.py" - <<<"${pod}")"
jq -r '"vllm " + (.argv | map(if test("^[-/A-Za-z0-9_.,=:]*$") then . else "'"'"'" + . + "'"'"'" end) | join(" "))' <<<"${received}"
echo
bold "== --kv-transfer-config as vLLM parses it ($(jq '.kvTransferConfigs | length' <<<"${received}") flag)"
jq '.kvTransferConfigs[]' <<<"${received}"
[[ "$(jq '.kvTransferConfigs | length' <<<"${received}")" == 1 ]] ||
  e2e_die "vLLM would receive $(jq '.kvTransferConfigs | length' <<<"${received}") --kv-transfer-config flags, not 1"
echo
bold "== PVCs in kv-offload-demo (the ephemeral one is created by the controller, owned by the pod)"
pvc_made() { k -n kv-offload-demo get pvc qwen3-kserve-demo-kv-cache-secondary-1 >/dev/null 2>&1; }
wait_until 60 "the ephemeral PVC" pvc_made
k -n kv-offload-demo get pvc -o custom-columns='NAME:.metadata.name,OWNER:.metadata.ownerReferences[0].kind,OWNER-NAME:.metadata.ownerReferences[0].name,SIZE:.spec.resources.requests.storage,MODES:.spec.accessModes'
echo
bold "== Webhook admission requests (metrics; every name in docs/metrics.md)"
# Two pods went through the webhook: the readiness probe's (a server-side dry-run in namespace
# kvoffload-e2e-probe, nothing stored) and the demo's. The API server called the webhook again
# for each (reinvocationPolicy: IfNeeded: an admission plugin changed the pod after the webhook
# had), and that call found it injected already.
echo "(two pods: the readiness probe's dry-run pod and the demo's, each called again on reinvocation)"
webhook_metrics | grep -E '^kvoffload_(admission_requests|injection_[a-z]+)_total' || true

if [[ "${DEMO_ONCE:-0}" == 1 ]]; then
  e2e_log "DEMO_ONCE=1: done"
  exit 0
fi
echo
bold "The control plane and webhook keep running. In another shell:"
echo "  export KUBECONFIG=${state}/admin.kubeconfig"
echo "  ${KUBECTL} -n kv-offload-demo get pod qwen3-kserve-demo -o yaml"
echo "Logs: ${state}/logs/. Press Ctrl-C to stop."
# Returns when any of our processes exits (then cleanup stops the rest) or on Ctrl-C.
mapfile -t pids < <(awk '{print $2}' "${state}/pids")
set +e
wait -n "${pids[@]}"
e2e_log "a control plane process exited; see the logs above"
exit 1
