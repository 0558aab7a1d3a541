# shellcheck shell=bash
# Case 11: certificate rotation as docs/deploy.md describes it, with no webhook restart:
# re-running certs/gen.sh (new serving cert, same CA) and then --rotate-ca (new CA, both CAs in
# the caBundle, configuration re-applied). After each, the webhook serves the new certificate
# and the API server still reaches it. Local mode only: in kind the kubelet's Secret sync
# (about a minute) is the part under test, and it is not ours.
if [[ "${E2E_CLUSTER}" != local ]]; then
  echo "skipped: needs the local webhook process"
  exit 77
fi
certs="${E2E_STATE}/webhook-certs"
pid="$(awk '$1 == "kv-offload-webhook" {print $2}' "${E2E_STATE}/pids")"
[[ -n "${pid}" ]] || fail "no webhook PID recorded"
served_serial() {
  openssl s_client -connect "${WEBHOOK_URL#https://}" -servername localhost </dev/null 2>/dev/null \
    | openssl x509 -noout -serial
}
serving() { [[ "$(served_serial)" == "$1" ]]; }

before="$(served_serial)"
assert_eq "$(openssl x509 -in "${certs}/tls.crt" -noout -serial)" "${before}" "served certificate before rotation"

"${E2E_REPO}/certs/gen.sh" --out "${certs}" --san 127.0.0.1 --san localhost --days 2
rotated="$(openssl x509 -in "${certs}/tls.crt" -noout -serial)"
[[ "${rotated}" != "${before}" ]] || fail "gen.sh did not issue a new certificate"
wait_until 30 "the webhook to serve the rotated certificate" serving "${rotated}"
wait_for_injection 30

"${E2E_REPO}/certs/gen.sh" --out "${certs}" --san 127.0.0.1 --san localhost --days 2 --rotate-ca
assert_eq 2 "$(grep -c 'BEGIN CERTIFICATE' "${certs}/ca-bundle.crt")" "CAs in the bundle after --rotate-ca"
k kustomize "${E2E_REPO}/manifests/base" \
  | python3 "${E2E_REPO}/e2e/tools/webhook_config_for_url.py" "${WEBHOOK_URL}" "${certs}/ca-bundle.crt" \
  | k apply -f - >/dev/null
new_ca="$(openssl x509 -in "${certs}/tls.crt" -noout -serial)"
wait_until 30 "the webhook to serve the certificate of the new CA" serving "${new_ca}"
wait_for_injection 30
openssl verify -CAfile "${certs}/ca.crt" "${certs}/tls.crt" >/dev/null || fail "new cert not from the new CA"

kill -0 "${pid}" 2>/dev/null || fail "the webhook process ${pid} is gone"
assert_eq "${pid}" "$(awk '$1 == "kv-offload-webhook" {print $2}' "${E2E_STATE}/pids")" "webhook PID (no restart)"
echo "rotated ${before} -> ${rotated} -> ${new_ca} (new CA) with webhook pid ${pid} serving throughout"
