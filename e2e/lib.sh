# shellcheck shell=bash
# Helpers shared by the e2e driver, the cluster modes and the cases. Source it; needs KUBECONFIG
# and KUBECTL set by the cluster mode. Every wait is a poll with a bounded timeout.

e2e_log() { printf '%s e2e: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
e2e_die() { printf 'e2e: error: %s\n' "$*" >&2; exit 1; }

k() { "${KUBECTL}" --kubeconfig "${KUBECONFIG}" "$@"; }

# free_port: an unused TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_until TIMEOUT_S DESCRIPTION CMD...: runs CMD until it succeeds, at most TIMEOUT_S seconds.
# Optional WAIT_PID: fail at once when that process has exited (its log is WAIT_LOG).
wait_until() {
  local timeout="$1" what="$2"; shift 2
  local deadline=$((SECONDS + timeout)) i=0
  local -a delays=(0.05 0.1 0.2 0.4 0.8)
  until "$@" >/dev/null 2>&1; do
    if [[ -n "${WAIT_PID:-}" ]] && ! kill -0 "${WAIT_PID}" 2>/dev/null; then
      [[ -n "${WAIT_LOG:-}" ]] && tail -n 30 "${WAIT_LOG}" >&2
      e2e_die "${what}: the process ${WAIT_PID} exited"
    fi
    if ((SECONDS >= deadline)); then
      [[ -n "${WAIT_LOG:-}" ]] && tail -n 30 "${WAIT_LOG}" >&2
      e2e_die "timed out after ${timeout}s waiting for ${what}"
    fi
    # Back off from 50 ms to 1 s between polls.
    sleep "${delays[i]:-1}"
    i=$((i + 1))
  done
}

# --- assertions (a failing one ends the case with a message) ---------------------------------
fail() { printf '    FAIL: %s\n' "$*" >&2; exit 1; }
assert_eq() { # want got what
  [[ "$2" == "$1" ]] || fail "$3: want '$1', got '$2'"
}
assert_contains() { # haystack needle what
  [[ "$1" == *"$2"* ]] || fail "$3: '$2' not found in: $1"
}
assert_not_contains() {
  [[ "$1" != *"$2"* ]] || fail "$3: '$2' unexpectedly found in: $1"
}
# jqv JSON FILTER: one value as raw text ("" for null).
jqv() { jq -r "$2 // empty" <<<"$1"; }

# --- objects ----------------------------------------------------------------------------------
# new_ns NAME [LABEL=VALUE...]: creates a namespace for a case and waits for its default
# ServiceAccount (pods are rejected until the controller creates it). Case namespaces enforce
# the baseline Pod Security level (no hostPath, host network or privileged containers), as a
# platform team's would: whatever the webhook injects must pass it. A case that needs more
# relabels its own namespace.
new_ns() {
  local ns="$1"; shift
  k create namespace "${ns}" >/dev/null
  k label namespace "${ns}" e2e.kvoffload.io/case=true pod-security.kubernetes.io/enforce=baseline \
    "$@" >/dev/null
  wait_until 60 "ServiceAccount default in ${ns}" k -n "${ns}" get serviceaccount default
}

# kserve_main SPEC_JSON: container "main" as KServe renders it (its bash launch script, with
# KServe's own --kv-transfer-config inside when SPEC_JSON is an LLMInferenceService's
# kvCacheOffloading; "" for none), from the same script the golden fixtures use.
kserve_main() {
  python3 "${E2E_REPO}/tests/webhook/kserve_fixtures.py" container Qwen/Qwen3-0.6B e2e ${1:+"$1"} |
    jq -c '. + {image: "vllm/vllm-openai:v0.33.0",
                resources: {limits: {memory: "64Gi"}, requests: {memory: "32Gi"}}}'
}

# pod_manifest NAME [ANNOTATIONS_JSON] [LABELS_JSON] [ARGS_JSON]: a vLLM pod in KServe's launch
# shape as JSON. Its nodeSelector matches no node, so under kind it stays Pending too (no
# multi-GiB image pull).
pod_manifest() {
  local name="$1" ann="${2:-}" labels="${3:-}" args="${4:-}"
  [[ -n "${ann}" ]] || ann='{}'
  [[ -n "${labels}" ]] || labels='{}'
  [[ -n "${args}" ]] || args='[]'
  jq -n --arg name "${name}" --argjson ann "${ann}" --argjson labels "${labels}" \
    --argjson args "${args}" --argjson main "$(kserve_main "")" '{
    apiVersion: "v1", kind: "Pod",
    metadata: {name: $name, annotations: $ann, labels: $labels},
    spec: {nodeSelector: {"e2e.kvoffload.io/never-scheduled": "true"},
           containers: [$main + (if $args == [] then {} else {args: $args} end)]}}'
}

# vllm_receives POD_JSON: the --kv-transfer-config values (a JSON array) that vLLM gets when the
# pod's launch command runs, by bash with a stand-in vllm (hack/vllm_argv.py).
vllm_receives() {
  python3 "${E2E_REPO}/hack/vllm_argv.py" - <<<"$1" | jq -c .kvTransferConfigs
}

get_pod() { k -n "$1" get pod "$2" -o json; }
container() { jq -c --arg c "${2:-main}" '.spec.containers[] | select(.name == $c)' <<<"$1"; }
env_of() { jq -r --arg n "$2" '.env // [] | map(select(.name == $n)) | .[0].value // empty' <<<"$1"; }

# webhook_metrics_through_api: the Prometheus text of every webhook replica, through the API
# server's pod proxy (the clusters where the webhook runs as pods).
webhook_metrics_through_api() {
  local pod
  for pod in $(k -n kv-offload-system get pods -l app.kubernetes.io/name=kv-offload-webhook \
                 --field-selector status.phase=Running -o jsonpath='{.items[*].metadata.name}'); do
    k get --raw "/api/v1/namespaces/kv-offload-system/pods/${pod}:9090/proxy/metrics"
  done
}

# webhook_metric_sum NAME: a metric summed over its labels and the webhook's replicas.
# Each cluster mode defines webhook_metrics (prints the Prometheus text of every replica).
webhook_metric_sum() {
  webhook_metrics | awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $NF} END {printf "%d\n", s}'
}

# webhook_requests: total admission requests the webhook has counted, across replicas.
webhook_requests() { webhook_metric_sum kvoffload_admission_requests_total; }

# case_ns PREFIX: a fresh namespace name (kind clusters outlive runs; names must not collide).
case_ns() { printf '%s-%s\n' "$1" "$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"; }

# create_pod NS JSON: creates the pod, failing the case with kubectl's message on a denial.
create_pod() {
  local out
  out="$(k -n "$1" create -f - -o json <<<"$2" 2>&1)" || fail "creating a pod in $1 was refused: ${out}"
  printf '%s\n' "${out}"
}

# create_denied NS JSON: expects the API server to refuse the pod; prints kubectl's message.
create_denied() {
  local out
  if out="$(k -n "$1" create -f - <<<"$2" 2>&1)"; then
    fail "pod was admitted, expected a denial: ${out}"
  fi
  printf '%s\n' "${out}"
}

# assert_not_injected POD_JSON: the webhook left the pod alone.
assert_not_injected() {
  local pod="$1"
  assert_eq "" "$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]')" "status annotation"
  assert_eq "0" "$(jq '[.spec.volumes // [] | .[] | select(.name | startswith("kv-cache-secondary-") or . == "kvoffload-agent")] | length' <<<"${pod}")" "kv-offload volumes"
  assert_eq "0" "$(jq '[.spec.containers[].env // [] | .[] | select(.name | startswith("KVOFFLOAD_"))] | length' <<<"${pod}")" "KVOFFLOAD_ env"
  assert_not_contains "$(jq -c '[.spec.containers[].args]' <<<"${pod}")" "--kv-transfer-config" "args"
}

# assert_injected_once POD_JSON NTIERS [CONTAINER]: the common shape of every injected pod,
# including "exactly once" (no duplicated volume, mount, env name or vLLM flag).
assert_injected_once() {
  local pod="$1" n="$2" cname="${3:-main}" c status
  status="$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"]')"
  [[ -n "${status}" ]] || fail "no kvoffload.io/status annotation"
  jq -e . <<<"${status}" >/dev/null || fail "status annotation is not JSON: ${status}"
  assert_eq "${n}" "$(jq '.tiers | length' <<<"${status}")" "tiers in the status annotation"
  [[ -n "$(jqv "${status}" '.configHash')" ]] || fail "status has no configHash: ${status}"
  c="$(container "${pod}" "${cname}")"
  [[ -n "${c}" ]] || fail "no container ${cname}"
  local i
  for ((i = 0; i < n; i++)); do
    assert_eq 1 "$(jq --arg v "kv-cache-secondary-${i}" '[.spec.volumes[] | select(.name == $v)] | length' <<<"${pod}")" "volume kv-cache-secondary-${i}"
    assert_eq 1 "$(jq --arg p "/mnt/kv-cache-${i}" --arg v "kv-cache-secondary-${i}" '[.volumeMounts // [] | .[] | select(.mountPath == $p and .name == $v)] | length' <<<"${c}")" "mount /mnt/kv-cache-${i} on ${cname}"
  done
  assert_eq "${n}" "$(jq '[.spec.volumes[] | select(.name | startswith("kv-cache-secondary-"))] | length' <<<"${pod}")" "tier volumes"
  assert_eq "$(jq '[.env // [] | .[].name] | length' <<<"${c}")" "$(jq '[.env // [] | .[].name] | unique | length' <<<"${c}")" "env names are unique"
  for e in KVOFFLOAD_CPU_BYTES KVOFFLOAD_EVICTION_POLICY KVOFFLOAD_TIERS KVOFFLOAD_CONFIG_HASH; do
    [[ -n "$(env_of "${c}" "${e}")" ]] || fail "env ${e} missing on ${cname}"
  done
  assert_eq "${n}" "$(env_of "${c}" KVOFFLOAD_TIERS | jq length)" "entries in KVOFFLOAD_TIERS"
  # Run the launch: a pod whose flag we placed (or kept) hands vLLM exactly one, valid JSON.
  local how got
  how="$(jqv "${status}" '.vllmFlag')"
  # vllmFlagInjected is true exactly when the flag vLLM gets is ours; else a reason says why.
  if [[ "${how}" == args || "${how}" == VLLM_ADDITIONAL_ARGS ]]; then
    assert_eq true "$(jq -c .vllmFlagInjected <<<"${status}")" "status vllmFlagInjected"
  else
    assert_eq false "$(jq -c .vllmFlagInjected <<<"${status}")" "status vllmFlagInjected"
    [[ -n "$(jqv "${status}" '.vllmFlagReason')" ]] || fail "status has no vllmFlagReason: ${status}"
  fi
  if [[ "${how}" == args || "${how}" == VLLM_ADDITIONAL_ARGS || "${how}" == user ]]; then
    got="$(vllm_receives "${pod}")"
    assert_eq 1 "$(jq length <<<"${got}")" "--kv-transfer-config values vLLM receives"
    assert_eq null "$(jq -c '.[0].invalid' <<<"${got}")" "the flag vLLM receives parses as JSON"
  fi
}

# kv_transfer_config POD_JSON: the --kv-transfer-config JSON that vLLM receives.
kv_transfer_config() {
  vllm_receives "$1" | jq -c '.[0] // empty'
}

# A pod that only our webhook would change, created with server-side dry-run (nothing stored)
# in a namespace whose default spec the webhook resolves: injected means the API server reaches
# the webhook through the installed configuration, TLS and caBundle included.
_probe_injected() {
  pod_manifest probe | k -n kvoffload-e2e-probe create --dry-run=server -o json -f - \
    | jq -e '.metadata.annotations["kvoffload.io/status"] != null' >/dev/null
}
# wait_for_injection TIMEOUT_S: creates the probe namespace and polls the probe.
wait_for_injection() {
  if ! k get namespace kvoffload-e2e-probe >/dev/null 2>&1; then
    k create namespace kvoffload-e2e-probe >/dev/null
    k label namespace kvoffload-e2e-probe kvoffload.io/injection=enabled >/dev/null
    k annotate namespace kvoffload-e2e-probe 'kvoffload.io/default-config={"cpu":"1Gi"}' >/dev/null
  fi
  wait_until "$1" "the webhook to mutate a dry-run probe pod" _probe_injected
}

# --- pods that run (clusters with a node: E2E_CLUSTER node or kind) ----------------------------
# need_node: ends a case as skipped (77) where no kubelet runs pods.
need_node() {
  if [[ "${E2E_CLUSTER}" == local ]]; then
    echo "no node here (E2E_NODE=0): pods are admitted and stored, never run"
    exit 77
  fi
}

# KServe's launch of vLLM in its LLMInferenceService templates, in our words: `bash -c SCRIPT --`
# with the user's args; the script reads `vllm --version`, adds KServe's own
# --kv-transfer-config only when neither VLLM_ADDITIONAL_ARGS nor the args carry one (this pod's
# LLMInferenceService leaves KServe's rendering off, so it adds none), and ends in an `eval` that
# parses the arguments a second time.
KSERVE_LAUNCH_SCRIPT='set -e
vllm --version
KV_TRANSFER_ARGS=""
case " ${VLLM_ADDITIONAL_ARGS:-} $* " in
  *--kv-transfer-config*|*--kv_transfer_config*) ;;
  *) KV_TRANSFER_ARGS="" ;;
esac
eval "exec vllm serve /mnt/models ${KV_TRANSFER_ARGS} ${VLLM_ADDITIONAL_ARGS:-} $@"'

# standin_pod NAME LLMISVC MODE LINGER_S: the pod KServe renders for LLMInferenceService LLMISVC
# (its labels, container `main`, the bash launch), running the stand-in image's `vllm`
# (e2e/node/standin/vllm) in MODE (agent or fill). It runs once (restartPolicy Never).
standin_pod() {
  jq -n --arg name "$1" --arg svc "$2" --arg mode "$3" --arg linger "$4" \
    --arg image "${E2E_STANDIN_IMAGE:?the cluster mode sets E2E_STANDIN_IMAGE}" \
    --arg script "${KSERVE_LAUNCH_SCRIPT}" '{
    apiVersion: "v1", kind: "Pod",
    metadata: {name: $name, labels: {
      "app.kubernetes.io/name": $svc, "app.kubernetes.io/part-of": "llminferenceservice",
      "app.kubernetes.io/component": "llminferenceservice-workload",
      "kserve.io/component": "workload", "llm-d.ai/role": "both"}},
    spec: {restartPolicy: "Never", terminationGracePeriodSeconds: 1,
           containers: [{name: "main", image: $image, imagePullPolicy: "Never",
                         command: ["/bin/bash", "-c", $script, "--"],
                         args: ["--served-model-name", $svc, "--port", "8000"],
                         env: [{name: "E2E_STANDIN_MODE", value: $mode},
                               {name: "E2E_STANDIN_LINGER", value: $linger}],
                         resources: {requests: {cpu: "10m", memory: "64Mi"}}}]}}'
}

# pod_phase NS NAME: the pod's phase, and its reason when it has one ("Failed/Evicted").
pod_phase() {
  k -n "$1" get pod "$2" -o jsonpath='{.status.phase}{"/"}{.status.reason}' 2>/dev/null
}

# standin_result NS POD: the stand-in's KVOFFLOAD-E2E-RESULT JSON from the main container's log.
standin_result() {
  k -n "$1" logs "$2" -c main | sed -n 's/^KVOFFLOAD-E2E-RESULT //p' | tail -n1
}
