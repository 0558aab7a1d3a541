# shellcheck shell=bash
# Case 7: pods the webhook configuration does not select are stored unchanged and the webhook is
# not even called (its request counter does not move): the opt-out label in a labelled namespace,
# an unlabelled pod in an unlabelled namespace, a namespace labelled injection=disabled and
# kube-system, the last two even with the pod opt-in label.
# Then a selected pod moves the counter, so the counter is shown to work.
lab="$(case_ns e2e-optout)"
plain="$(case_ns e2e-unlabelled)"
new_ns "${lab}" kvoffload.io/injection=enabled
new_ns "${plain}"
off="$(case_ns e2e-disabled)"
new_ns "${off}" kvoffload.io/injection=disabled
cfg='{"kvoffload.io/config":"{\"cpu\":\"1Gi\"}"}'
before="$(webhook_requests)"

create_pod "${lab}" "$(pod_manifest optout "${cfg}" '{"kvoffload.io/inject":"false"}')" >/dev/null
assert_not_injected "$(get_pod "${lab}" optout)"
create_pod "${plain}" "$(pod_manifest unlabelled "${cfg}")" >/dev/null
assert_not_injected "$(get_pod "${plain}" unlabelled)"
# A namespace labelled kvoffload.io/injection=disabled is opted out, even for pods that ask.
create_pod "${off}" "$(pod_manifest asks "${cfg}" '{"kvoffload.io/inject":"true"}')" >/dev/null
assert_not_injected "$(get_pod "${off}" asks)"
ks="$(case_ns e2e-kube-system-probe)"
create_pod kube-system "$(pod_manifest "${ks}" "${cfg}" '{"kvoffload.io/inject":"true"}')" >/dev/null
assert_not_injected "$(get_pod kube-system "${ks}")"
k -n kube-system delete pod "${ks}" --wait=false >/dev/null

assert_eq "${before}" "$(webhook_requests)" "webhook admission requests while creating unselected pods"

create_pod "${plain}" "$(pod_manifest optin "${cfg}" '{"kvoffload.io/inject":"true"}')" >/dev/null
assert_injected_once "$(get_pod "${plain}" optin)" 0
after="$(webhook_requests)"
((after > before)) || fail "the request counter did not move for a selected pod (${before} -> ${after})"
