# shellcheck shell=bash
# E2E_CLUSTER=kind: a kind cluster with the webhook deployed as a platform team would, from
# manifests/overlays/self-signed and certs/gen.sh, with images built by `make images` and loaded
# with `kind load`. Source it after ../lib.sh. Needs docker (or KIND_EXPERIMENTAL_PROVIDER) and kind.
#   KIND_CLUSTER       cluster name (default kv-offload-e2e)
#   KIND_NODE_IMAGE    node image (default: kind's own for its version)
#   E2E_KIND_KEEP=1    keep the cluster after the run (it is reused by the next run)

kind_up() {
  local repo="${E2E_REPO}" name="${KIND_CLUSTER:-kv-offload-e2e}"
  command -v kind >/dev/null || e2e_die "kind not found: see https://kind.sigs.k8s.io (E2E_CLUSTER=kind)"
  command -v "${CONTAINER_TOOL:-docker}" >/dev/null || e2e_die "${CONTAINER_TOOL:-docker} not found"
  local bin
  bin="$("${repo}/e2e/controlplane/build.sh" kubectl | tail -n1)"
  export KUBECTL="${bin}/kubectl"
  export KUBECONFIG="${E2E_STATE}/kind.kubeconfig"
  KIND_CREATED=0
  if kind get clusters 2>/dev/null | grep -qx "${name}"; then
    e2e_log "reusing kind cluster ${name}"
    kind export kubeconfig --name "${name}" --kubeconfig "${KUBECONFIG}" >/dev/null
  else
    kind create cluster --name "${name}" --config "${repo}/e2e/kind/cluster.yaml" \
      --kubeconfig "${KUBECONFIG}" ${KIND_NODE_IMAGE:+--image "${KIND_NODE_IMAGE}"} --wait 120s \
      || e2e_die "kind create cluster failed"
    KIND_CREATED=1
  fi

  local tag
  tag="e2e-$(date +%s)"
  make -C "${repo}" images IMAGE_TAG="${tag}" >&2 || e2e_die "make images failed"
  # The stand-in for a vLLM image that the cases needing a node run (e2e/node/standin).
  "${CONTAINER_TOOL:-docker}" build -f "${repo}/e2e/node/standin/Dockerfile" \
    -t "kv-offload/e2e-standin:${tag}" "${repo}/e2e/node/standin" >&2 \
    || e2e_die "building the stand-in image failed"
  kind load docker-image --name "${name}" "kv-offload/webhook:${tag}" \
    "kv-offload/offload-agent:${tag}" "kv-offload/e2e-standin:${tag}" >&2 \
    || e2e_die "kind load docker-image failed"
  export E2E_AGENT_IMAGE="kv-offload/offload-agent:${tag}"
  export E2E_STANDIN_IMAGE="docker.io/kv-offload/e2e-standin:${tag}"

  # The documented install: certs/gen.sh, then the self-signed overlay, here with the images
  # just built (a kustomization on top of the overlay, as a platform team would write one).
  "${repo}/certs/gen.sh" >&2 || e2e_die "certs/gen.sh failed"
  local ov="${E2E_STATE}/kind-overlay" rel
  mkdir -p "${ov}"
  # kustomize accepts only relative paths to other kustomizations.
  rel="$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
           "${repo}/manifests/overlays/self-signed" "${ov}")"
  cat > "${ov}/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ${rel}
images:
  - name: kv-offload/webhook
    newTag: "${tag}"
patches:
  - target:
      kind: Deployment
      name: kv-offload-webhook
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/args
        value: [serve, --port=8443, --metrics-port=9090,
                --tls-cert-file=/etc/kv-offload/tls/tls.crt, --tls-key-file=/etc/kv-offload/tls/tls.key,
                --agent-image=${E2E_AGENT_IMAGE}, --default-mode=agent, --lookup-timeout=2s,
                --log-format=json]
YAML
  k kustomize "${ov}" > "${E2E_STATE}/kind-deploy.yaml" || e2e_die "kustomize of the kind overlay failed"
  k apply -f "${E2E_STATE}/kind-deploy.yaml" >&2 || e2e_die "applying the manifests failed"
  k -n kv-offload-system rollout status deployment/kv-offload-webhook --timeout 180s >&2 \
    || e2e_die "the webhook Deployment did not become ready"
  install_test_crds
  wait_for_injection 120
}

webhook_metrics() { webhook_metrics_through_api; }

kind_down() {
  local name="${KIND_CLUSTER:-kv-offload-e2e}"
  [[ -n "${KUBECONFIG:-}" && -f "${KUBECONFIG}" ]] || return 0
  if [[ "${E2E_KIND_KEEP:-0}" == 1 || "${KIND_CREATED:-0}" == 0 ]]; then
    # Reused or kept: remove only what the cases created.
    k delete namespace -l e2e.kvoffload.io/case=true --wait=false >/dev/null 2>&1 || true
    k delete mutatingwebhookconfiguration -l e2e.kvoffload.io/case=true >/dev/null 2>&1 || true
    e2e_log "kind cluster ${name} kept"
  else
    kind delete cluster --name "${name}" >&2 || true
  fi
}
