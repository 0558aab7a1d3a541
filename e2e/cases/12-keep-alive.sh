# shellcheck shell=bash
# Case 12: the API server's connection to the webhook outlives a quiet spell of 7 s (the
# webhook's idle deadline was 5 s): the API server (Go's client, idle for at most 90 s) is the
# side that closes it, so it never sends an admission on a connection the webhook is closing (a
# POST Go would not resend: the pod refused, or admitted without offloading).
ns="$(case_ns e2e-keepalive)"
new_ns "${ns}" kvoffload.io/injection=enabled
create_pod "${ns}" "$(pod_manifest first '{"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}')" >/dev/null
sleep 7
open="$(webhook_metric_sum kvoffload_webhook_open_connections)"
[[ "${open}" -ge 1 ]] || fail "no connection from the API server is open 7 s after an admission (${open})"
create_pod "${ns}" "$(pod_manifest second '{"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}')" >/dev/null
assert_injected_once "$(get_pod "${ns}" second)" 0
