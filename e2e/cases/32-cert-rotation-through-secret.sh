# shellcheck shell=bash
# Case 32 (our node): certificate rotation of the webhook Deployment as docs/deploy.md describes
# it, with no pod restart: certs/gen.sh again (new serving certificate, same CA) and the Secret
# applied, then --rotate-ca with the self-signed overlay re-applied (both CAs in the caBundle).
# The kubelet projects each new Secret into the pods' volume, every replica serves the new
# certificate (checked on each pod's address, which only our node's namespace can reach), and
# the API server keeps reaching the webhook through its Service. Case 11 does the same for a
# local webhook process.
if [[ "${E2E_CLUSTER}" != node ]]; then
  echo "skipped: needs our node (pod addresses reachable from the test, the overlay it applied)"
  exit 77
fi
certs="${E2E_WEBHOOK_CERTS}"
sel=app.kubernetes.io/name=kv-offload-webhook
pods() { k -n kv-offload-system get pods -l "${sel}" -o json; }
before_pods="$(pods | jq -c '[.items[] | {uid: .metadata.uid, restarts: [.status.containerStatuses[].restartCount]}] | sort_by(.uid)')"
ips="$(pods | jq -r '.items[].status.podIP')"
[[ -n "${ips}" ]] || fail "no webhook pod addresses"
served_serial() {
  openssl s_client -connect "$1:8443" -servername kv-offload-webhook.kv-offload-system.svc \
    </dev/null 2>/dev/null | openssl x509 -noout -serial
}
all_serving() {
  local ip
  for ip in ${ips}; do [[ "$(served_serial "${ip}")" == "$1" ]] || return 1; done
}
apply_overlay() {
  k kustomize "${E2E_WEBHOOK_OVERLAY}" \
    | k apply --server-side --field-manager kv-offload-e2e -f - >/dev/null
}

initial="$(openssl x509 -in "${certs}/tls.crt" -noout -serial)"
all_serving "${initial}" || fail "the pods do not serve ${certs}/tls.crt before the rotation"

"${E2E_REPO}/certs/gen.sh" --out "${certs}" >/dev/null
rotated="$(openssl x509 -in "${certs}/tls.crt" -noout -serial)"
[[ "${rotated}" != "${initial}" ]] || fail "gen.sh did not issue a new certificate"
k apply --server-side --field-manager kv-offload-e2e -f "${certs}/secret.yaml" >/dev/null
t0=${SECONDS}
wait_until 120 "every webhook pod to serve the rotated certificate" all_serving "${rotated}"
echo "rotated certificate served by every pod $((SECONDS - t0))s after the Secret changed"
wait_for_injection 30

"${E2E_REPO}/certs/gen.sh" --out "${certs}" --rotate-ca >/dev/null
assert_eq 2 "$(grep -c 'BEGIN CERTIFICATE' "${certs}/ca-bundle.crt")" "CAs in the bundle after --rotate-ca"
apply_overlay
new_ca="$(openssl x509 -in "${certs}/tls.crt" -noout -serial)"
wait_until 120 "every webhook pod to serve the certificate of the new CA" all_serving "${new_ca}"
wait_for_injection 30

assert_eq "${before_pods}" "$(pods | jq -c '[.items[] | {uid: .metadata.uid, restarts: [.status.containerStatuses[].restartCount]}] | sort_by(.uid)')" "webhook pods and restart counts (no restart)"
echo "rotated ${initial} -> ${rotated} -> ${new_ca} (new CA) on $(wc -w <<<"${ips}") pods, none restarted"
