# shellcheck shell=bash
# Case 10: every kustomization under manifests/ renders and applies with server-side dry-run
# against the real API server, and the webhook's own pod passes the restricted Pod Security
# level that its namespace enforces (a pod without the hardening is refused there).
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
cp -r "${E2E_REPO}/manifests" "${work}/manifests"
rm -rf "${work}/manifests/overlays/self-signed/generated"
"${E2E_REPO}/certs/gen.sh" --out "${work}/manifests/overlays/self-signed/generated" >/dev/null
if ! k get crd certificates.cert-manager.io >/dev/null 2>&1; then
  k apply -f "${E2E_REPO}/e2e/testdata/cert-manager-crds-stub.yaml" >/dev/null
  for crd in certificates.cert-manager.io issuers.cert-manager.io; do
    k wait --for condition=Established --timeout 60s "crd/${crd}" >/dev/null
  done
fi
# The namespace must exist for namespaced objects to be dry-run (a dry-run Namespace is not
# stored); apply the base's Namespace for real, as installing does first.
k kustomize "${work}/manifests/base" > "${work}/base.yaml"
python3 - "${work}/base.yaml" > "${work}/ns.yaml" <<'PY'
import sys, yaml
yaml.safe_dump_all([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Namespace"], sys.stdout)
PY
k apply --server-side --field-manager kv-offload-e2e -f "${work}/ns.yaml" >/dev/null
count=0
for dir in "${work}/manifests/base" "${work}/manifests/overlays"/*/; do
  dir="${dir%/}"
  name="$(basename "${dir}")"
  k kustomize "${dir}" > "${work}/${name}.yaml" || fail "kustomize ${name}"
  # The installed webhook configuration (a url instead of the Service in local mode, another
  # caBundle) would be merged with ours by server-side apply; dry-run ours under its own name so
  # the API server validates exactly what was rendered.
  python3 - "${work}/${name}.yaml" "${name}" > "${work}/${name}.apply.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "MutatingWebhookConfiguration":
        d["metadata"]["name"] += "-dryrun-" + sys.argv[2]
yaml.safe_dump_all(docs, sys.stdout)
PY
  out="$(k apply --server-side --dry-run=server --field-manager kv-offload-e2e -f "${work}/${name}.apply.yaml" 2>&1)" \
    || fail "server-side dry-run of ${name}: ${out}"
  echo "${name}:"; sed 's/^/  /' <<<"${out}"
  assert_contains "${out}" "mutatingwebhookconfiguration.admissionregistration.k8s.io/kv-offload-webhook-dryrun-${name} serverside-applied (server dry run)" "${name}"
  assert_contains "${out}" "deployment.apps/kv-offload-webhook serverside-applied (server dry run)" "${name}"
  count=$((count + 1))
done
((count >= 3)) || fail "expected base and 2 overlays, applied ${count}"

# manifests/monitoring against the Prometheus Operator's own CRDs, read from its Go module
# through the module proxy (as the control plane's sources are): the PrometheusRule and the
# PodMonitor must be what the operator's schemas accept, not what we believe they are. The
# CRDs stay installed (nothing serves them); server-side dry-run as above. With a node the
# module was fetched before its namespaces were entered (they have no network).
# shellcheck source=e2e/controlplane/versions.env
source "${E2E_REPO}/e2e/controlplane/versions.env"
crds="${E2E_PROMETHEUS_CRDS:-}"
[[ -n "${crds}" ]] || crds="$("${E2E_REPO}/e2e/controlplane/prometheus-crds.sh")" \
  || fail "could not fetch the Prometheus Operator's CRDs (above)"
for crd in prometheusrules podmonitors; do
  k apply --server-side --field-manager kv-offload-e2e \
    -f "${crds}/monitoring.coreos.com_${crd}.yaml" >/dev/null
  k wait --for condition=Established --timeout 60s "crd/${crd}.monitoring.coreos.com" >/dev/null
done
k kustomize "${work}/manifests/monitoring" > "${work}/monitoring.yaml" || fail "kustomize monitoring"
out="$(k apply --server-side --dry-run=server --field-manager kv-offload-e2e \
         -f "${work}/monitoring.yaml" 2>&1)" || fail "server-side dry-run of monitoring: ${out}"
echo "monitoring (Prometheus Operator ${KVOFFLOAD_PROMETHEUS_OPERATOR_VERSION} CRDs):"
sed 's/^/  /' <<<"${out}"
assert_contains "${out}" "prometheusrule.monitoring.coreos.com/kv-offload serverside-applied (server dry run)" "PrometheusRule"
assert_contains "${out}" "podmonitor.monitoring.coreos.com/kv-offload-webhook serverside-applied (server dry run)" "PodMonitor"
# The schemas are checked, not only the kinds: a PodMonitor field the operator does not know
# (strict field validation, kubectl's default) is refused.
python3 - "${work}/monitoring.yaml" > "${work}/monitoring-bad.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "PodMonitor":
        d["spec"]["podMetricsEndpoints"][0]["scrapeEvery"] = "30s"
yaml.safe_dump_all(docs, sys.stdout)
PY
grep -q scrapeEvery "${work}/monitoring-bad.yaml" || fail "no PodMonitor endpoint to break"
out="$(k apply --server-side --dry-run=server --field-manager kv-offload-e2e \
         -f "${work}/monitoring-bad.yaml" 2>&1)" \
  && fail "a PodMonitor with an unknown field was accepted: the CRD's schema is not applied"
assert_contains "${out}" "scrapeEvery" "the unknown field named in the refusal"

# Pod Security: the Deployment's pod template as a Pod, in the namespace enforcing restricted.
podify() {
  python3 - "$1" <<'PY'
import json, sys, yaml
dep = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"][0]
t = dep["spec"]["template"]
print(json.dumps({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "pss-check", "labels": t["metadata"].get("labels", {})},
                  "spec": t["spec"]}))
PY
}
podify "${work}/base.yaml" > "${work}/pod.json"
out="$(k -n kv-offload-system create --dry-run=server -f "${work}/pod.json" 2>&1)" \
  || fail "the webhook's pod is refused under the restricted Pod Security level: ${out}"
assert_not_contains "${out}" "Warning" "Pod Security warnings for the webhook's pod"
jq '.spec.containers[0].securityContext = {} | .spec.securityContext = {}' "${work}/pod.json" > "${work}/bad.json"
out="$(k -n kv-offload-system create --dry-run=server -f "${work}/bad.json" 2>&1)" \
  && fail "a pod without the hardening was admitted: the namespace does not enforce restricted"
assert_contains "${out}" 'violates PodSecurity "restricted' "Pod Security denial"
