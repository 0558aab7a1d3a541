#!/usr/bin/env bash
# End-to-end driver: brings up a cluster, runs every case in e2e/cases/ against it, tears down.
#   E2E_CLUSTER=local (default): etcd + kube-apiserver + kube-controller-manager built from Go
#                    modules (e2e/controlplane/) and, unless E2E_NODE=0, a real node
#                    (e2e/node/: kubelet, kube-scheduler, containerd) in namespaces of its own,
#                    with the webhook deployed from manifests/; with E2E_NODE=0 the webhook
#                    runs as a local process and pods are stored, never run.
#   E2E_CLUSTER=kind: a kind cluster with the webhook deployed from manifests/ (e2e/kind/).
#   E2E_NODE=0       leave the node out (a machine that cannot run one: not root, no containerd)
#   E2E_WEBHOOK_BIN  webhook binary for local mode (default build/webhook/kv-offload-webhook)
#   E2E_CASES        space-separated case names to run (default: all)
#   E2E_KEEP=1       keep the state directory (logs, certs, kubeconfig) after the run
# The last line is "N passed, M failed".
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export E2E_REPO="${repo}"
# shellcheck source=lib.sh
source "${repo}/e2e/lib.sh"

mode="${E2E_CLUSTER:-local}"
node="${E2E_NODE:-1}"
[[ "${node}" == 0 || "${node}" == 1 ]] || e2e_die "E2E_NODE must be 0 or 1, got '${node}'"
if [[ "${mode}" == local && "${node}" == 1 && "${E2E_NODE_INSIDE:-0}" != 1 ]]; then
  # shellcheck source=node/node.sh
  source "${repo}/e2e/node/node.sh"
  # Everything below runs again as the init of the node's namespaces. Called plainly, not
  # left of `||`: there bash ignores errexit in the whole function, and a failed kubelet build
  # on the host went on to fail again, for want of network, inside the namespace.
  node_enter "${BASH_SOURCE[0]}" "$@"
  exit 0
fi
if [[ "${mode}" == local && "${node}" == 0 ]]; then
  e2e_log "E2E_NODE=0: no node; pods are admitted and stored but never run, the webhook runs as a local process, and the cases that need a node are skipped"
fi

# The LLMInferenceService CRD stand-in, before the webhook starts looking such objects up.
install_test_crds() {
  k apply -f "${repo}/e2e/testdata/llminferenceservice-crd.yaml" >/dev/null
  k wait --for condition=Established --timeout 60s crd/llminferenceservices.serving.kserve.io \
    crd/llminferenceserviceconfigs.serving.kserve.io >/dev/null
}
state="$(mktemp -d "${TMPDIR:-/tmp}/kvoffload-e2e.XXXXXX")"
export E2E_STATE="${state}"

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  case "${mode}" in
    local) cp_down "${state}" ;;
    node) node_down "${state}" ;;
    kind) kind_down ;;
  esac
  if [[ "${E2E_KEEP:-0}" == 1 || ${rc} -ne 0 ]]; then
    e2e_log "state kept in ${state}"
  else
    rm -rf "${state}"
  fi
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

case "${mode}" in
  local)
    # shellcheck source=controlplane/local.sh
    source "${repo}/e2e/controlplane/local.sh"
    t0=${SECONDS}
    bin="$("${repo}/e2e/controlplane/build.sh" | tail -n1)"
    e2e_log "control plane binaries ready in $((SECONDS - t0))s (${bin})"
    if [[ "${node}" == 1 ]]; then
      # shellcheck source=node/node.sh
      source "${repo}/e2e/node/node.sh"
      node_netns
      t0=${SECONDS}
      bin="$("${repo}/e2e/controlplane/build.sh" kubelet kube-scheduler | tail -n1)"
      e2e_log "node binaries ready in $((SECONDS - t0))s"
      export CP_NODE_IP="${NODE_IP}" CP_SERVICE_IP="${NODE_SERVICE_IP}" CP_NODE_NAME="${NODE_NAME}"
      mode=node
    fi
    cp_up "${state}" "${bin}"
    install_test_crds
    if [[ "${node}" == 1 ]]; then
      node_up "${state}" "${bin}"
      node_webhook_up "${state}"
    else
      wh_up "${state}" "${E2E_WEBHOOK_BIN:-${repo}/build/webhook/kv-offload-webhook}" "${repo}"
    fi
    ;;
  kind)
    # shellcheck source=kind/kind.sh
    source "${repo}/e2e/kind/kind.sh"
    kind_up
    ;;
  *) e2e_die "E2E_CLUSTER must be local or kind, got '${mode}'" ;;
esac
export E2E_CLUSTER="${mode}"

passed=0 failed=0 skipped=0 failed_names=()
for f in "${repo}"/e2e/cases/[0-9]*.sh; do
  name="$(basename "${f}" .sh)"
  if [[ -n "${E2E_CASES:-}" && " ${E2E_CASES} " != *" ${name} "* && " ${E2E_CASES} " != *" ${name%%-*} "* ]]; then
    continue
  fi
  t0=${SECONDS}
  # Each case runs in its own shell: a failed assertion exits it, and nothing leaks between cases.
  # (Not as an `if` condition: bash ignores errexit inside a subshell used as a condition.)
  set +e
  # shellcheck source=/dev/null
  (set -euo pipefail; source "${f}") > "${state}/case-${name}.log" 2>&1
  rc=$?
  set -e
  if ((rc == 0)); then
    passed=$((passed + 1))
    printf 'PASS %-32s %3ds\n' "${name}" $((SECONDS - t0))
  elif ((rc == 77)); then
    # A case that does not apply to this cluster mode exits 77 (automake's convention).
    skipped=$((skipped + 1))
    printf 'SKIP %-32s %s\n' "${name}" "$(tail -n1 "${state}/case-${name}.log")"
  else
    failed=$((failed + 1))
    failed_names+=("${name}")
    printf 'FAIL %-32s %3ds\n' "${name}" $((SECONDS - t0))
    sed 's/^/    | /' "${state}/case-${name}.log"
  fi
done

if ((failed > 0)) && [[ "${mode}" == local ]]; then
  echo "---- webhook log (last 40 lines) ----"
  tail -n 40 "${state}/logs/webhook.log" || true
elif ((failed > 0)) && [[ "${mode}" == node ]]; then
  echo "---- webhook pods' logs (last 40 lines) ----"
  k -n kv-offload-system logs -l app.kubernetes.io/name=kv-offload-webhook --tail 40 --prefix || true
fi
((passed + failed > 0)) || e2e_die "no case ran (E2E_CASES='${E2E_CASES:-}')"
if ((skipped > 0)); then
  echo "${passed} passed, ${failed} failed, ${skipped} skipped"
else
  echo "${passed} passed, ${failed} failed"
fi
((failed == 0))
