# shellcheck shell=bash
# Case 99 (runs last: it takes the webhook down): with no webhook answering, failurePolicy Fail
# refuses pods the configuration selects, and only those: kube-system, the webhook's own
# namespace and unselected namespaces keep working (no cluster-wide deadlock). Local mode stops
# the process with SIGTERM (its graceful shutdown); kind scales the Deployment to 0 and back.
ns="$(case_ns e2e-failpolicy)"
plain="$(case_ns e2e-failpolicy-plain)"
new_ns "${ns}" kvoffload.io/injection=enabled
new_ns "${plain}"
cfg='{"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}'

if [[ "${E2E_CLUSTER}" == local ]]; then
  pid="$(awk '$1 == "kv-offload-webhook" {print $2}' "${E2E_STATE}/pids")"
  kill -TERM "${pid}"
  # Draining: still running, no longer ready (so a Service would stop sending it requests).
  draining() {
    kill -0 "${pid}" 2>/dev/null &&
      ! curl -fsS --cacert "${E2E_STATE}/webhook-certs/ca-bundle.crt" "${WEBHOOK_URL}/readyz"
  }
  wait_until 4 "/readyz to fail while the webhook drains after SIGTERM" draining
  gone() { ! kill -0 "${pid}" 2>/dev/null; }
  wait_until 30 "the webhook to exit after SIGTERM" gone
else
  k -n kv-offload-system scale deployment kv-offload-webhook --replicas 0 >/dev/null
  trap 'k -n kv-offload-system scale deployment kv-offload-webhook --replicas 2 >/dev/null
        k -n kv-offload-system rollout status deployment/kv-offload-webhook --timeout 180s >/dev/null' EXIT
  no_pods() { [[ -z "$(k -n kv-offload-system get pods -l app.kubernetes.io/name=kv-offload-webhook -o name)" ]]; }
  wait_until 120 "the webhook pods to be gone" no_pods
fi

msg="$(create_denied "${ns}" "$(pod_manifest refused "${cfg}")")"
echo "selected namespace: ${msg}"
assert_contains "${msg}" 'failed calling webhook "namespace.webhook.kvoffload.io"' "failurePolicy Fail"
msg="$(create_denied "${plain}" "$(pod_manifest refused-optin "${cfg}" '{"kvoffload.io/inject":"true"}')")"
assert_contains "${msg}" 'failed calling webhook "object.webhook.kvoffload.io"' "failurePolicy Fail (object entry)"

create_pod "${plain}" "$(pod_manifest unselected "${cfg}")" >/dev/null
ks="$(case_ns e2e-failpolicy-ks)"
create_pod kube-system "$(pod_manifest "${ks}" "${cfg}" '{"kvoffload.io/inject":"true"}')" >/dev/null
k -n kube-system delete pod "${ks}" --wait=false >/dev/null
create_pod kv-offload-system "$(jq '.metadata.labels["kvoffload.io/inject"] = "true"
  | .spec.securityContext = {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: "RuntimeDefault"}}
  | .spec.containers[0].securityContext = {allowPrivilegeEscalation: false, capabilities: {drop: ["ALL"]}}' \
  <<<"$(pod_manifest own-namespace "${cfg}")")" >/dev/null
k -n kv-offload-system delete pod own-namespace --wait=false >/dev/null
echo "unselected, kube-system and kv-offload-system pods were created with the webhook down"
