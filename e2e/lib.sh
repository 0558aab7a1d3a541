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
# ServiceAccount (pods are rejected until the controller creates it).
new_ns() {
  local ns="$1"; shift
  k create namespace "${ns}" >/dev/null
  k label namespace "${ns}" e2e.kvoffload.io/case=true "$@" >/dev/null
  wait_until 60 "ServiceAccount default in ${ns}" k -n "${ns}" get serviceaccount default
}

# pod_manifest NAME [ANNOTATIONS_JSON] [LABELS_JSON] [ARGS_JSON]: a vLLM-like Pod as JSON.
pod_manifest() {
  local name="$1" ann="${2:-}" labels="${3:-}" args="${4:-}"
  [[ -n "${ann}" ]] || ann='{}'
  [[ -n "${labels}" ]] || labels='{}'
  [[ -n "${args}" ]] || args='[]'
  jq -n --arg name "${name}" --argjson ann "${ann}" --argjson labels "${labels}" \
    --argjson args "${args}" '{
    apiVersion: "v1", kind: "Pod",
    metadata: {name: $name, annotations: $ann, labels: $labels},
    spec: {containers: [{name: "main", image: "vllm/vllm-openai:v0.22.0",
                         command: ["vllm", "serve"], args: (["Qwen/Qwen3-0.6B"] + $args),
                         resources: {limits: {memory: "64Gi"}, requests: {memory: "32Gi"}}}]}}'
}

get_pod() { k -n "$1" get pod "$2" -o json; }
container() { jq -c --arg c "${2:-main}" '.spec.containers[] | select(.name == $c)' <<<"$1"; }
env_of() { jq -r --arg n "$2" '.env // [] | map(select(.name == $n)) | .[0].value // empty' <<<"$1"; }

# webhook_requests: total admission requests the webhook has counted, across replicas.
# Each cluster mode defines webhook_metrics (prints the Prometheus text of every replica).
webhook_requests() {
  webhook_metrics | awk '/^kvoffload_admission_requests_total[{ ]/ {s += $NF} END {printf "%d\n", s}'
}
