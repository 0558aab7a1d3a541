# shellcheck shell=bash
# The local control plane: etcd, kube-apiserver and kube-controller-manager from the cache that
# build.sh fills, plus the webhook process, all on 127.0.0.1 and free ports. Source it after
# ../lib.sh. Every process started is recorded in STATE/pids and stopped by cp_down.
#
#   cp_up STATE BIN          start etcd, the API server and the controller manager
#   wh_up STATE WEBHOOK REPO start the webhook, install its configuration, wait until it injects
#   cp_down STATE            stop everything started, last first
# Exports KUBECONFIG, KUBECTL, WEBHOOK_METRICS_URL, CP_API_PORT.
#
# With CP_NODE_IP and CP_SERVICE_IP set (the e2e node, ../node/node.sh, inside its own network
# namespace) the API server also listens on those addresses at 443, as the `kubernetes` Service
# that pods reach, reaches kubelets and webhook endpoints directly (no kube-proxy), authorizes
# kubelets (Node), and the controller manager also runs what pods on a node need.

# Controllers the cases need: ephemeral PVCs, their deletion with the pod (garbage collector and
# PVC protection), namespaces and their default ServiceAccount, and Deployments.
KVOFFLOAD_CONTROLLERS="ephemeral-volume-controller,garbage-collector-controller,namespace-controller"
KVOFFLOAD_CONTROLLERS+=",serviceaccount-controller,persistentvolumeclaim-protection-controller"
KVOFFLOAD_CONTROLLERS+=",deployment-controller,replicaset-controller"

_cp_start() { # NAME LOG CMD... : start CMD in the background and record its PID
  local name="$1" log="$2"; shift 2
  "$@" >"${log}" 2>&1 &
  local pid=$!
  echo "${name} ${pid}" >> "${CP_STATE}/pids"
  e2e_log "started ${name} (pid ${pid}, log ${log})"
  LAST_PID=${pid}
}

_cp_pki() {
  local pki="$1"
  mkdir -p "${pki}"
  (
    cd "${pki}"
    umask 077
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
      -keyout ca.key -out ca.crt -days 2 -subj "/CN=kvoffload-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
    # name CN O extensions
    _leaf() {
      openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      printf '%s\n' "$3" > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
        -days 2 -sha256 -extfile "$1.ext" 2>/dev/null
    }
    _leaf apiserver "/CN=kube-apiserver" \
      "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc${CP_NODE_IP:+,IP:${CP_NODE_IP},IP:${CP_SERVICE_IP}}
extendedKeyUsage=serverAuth"
    if [[ -n "${CP_NODE_IP:-}" ]]; then
      # The node's kubelet, as the Node authorizer knows kubelets.
      _leaf kubelet "/O=system:nodes/CN=system:node:${CP_NODE_NAME}" "extendedKeyUsage=clientAuth"
    fi
    _leaf admin "/O=system:masters/CN=kvoffload-e2e-admin" "extendedKeyUsage=clientAuth"
    # The webhook authenticates as its ServiceAccount's user name, so the ClusterRoleBinding from
    # manifests/base is what grants it access: the e2e proves that RBAC is enough.
    _leaf webhook-client \
      "/O=system:serviceaccounts/O=system:serviceaccounts:kv-offload-system/CN=system:serviceaccount:kv-offload-system:kv-offload-webhook" \
      "extendedKeyUsage=clientAuth"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || e2e_die "could not generate the control plane certificates"
}

_cp_kubeconfig() { # FILE SERVER CA CERT KEY
  local f="$1"
  "${KUBECTL}" config --kubeconfig "${f}" set-cluster local --server "$2" \
    --certificate-authority "$3" --embed-certs >/dev/null
  "${KUBECTL}" config --kubeconfig "${f}" set-credentials user --client-certificate "$4" \
    --client-key "$5" --embed-certs >/dev/null
  "${KUBECTL}" config --kubeconfig "${f}" set-context local --cluster local --user user >/dev/null
  "${KUBECTL}" config --kubeconfig "${f}" use-context local >/dev/null
}

_etcd_healthy() { curl -fsS --max-time 10 "http://127.0.0.1:$1/health" | grep -q '"health":"true"'; }

cp_up() {
  CP_STATE="$1"
  local bin="$2"
  mkdir -p "${CP_STATE}/logs"
  : > "${CP_STATE}/pids"
  export KUBECTL="${bin}/kubectl"
  for b in etcd kube-apiserver kube-controller-manager kubectl; do
    [[ -x "${bin}/${b}" ]] || e2e_die "${bin}/${b} missing: run e2e/controlplane/build.sh"
  done
  # Loopback only; keep any proxy settings away from the API server's calls to the webhook.
  export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,${NO_PROXY}}" no_proxy="127.0.0.1,localhost${no_proxy:+,${no_proxy}}"
  local t0=${SECONDS}
  local pki="${CP_STATE}/pki"
  _cp_pki "${pki}"

  local etcd_port etcd_peer api_port bind=127.0.0.1 advertise=127.0.0.1 authz=RBAC
  local -a node_flags=() controllers=("${KVOFFLOAD_CONTROLLERS}")
  etcd_port="$(free_port)"; etcd_peer="$(free_port)"; api_port="$(free_port)"
  if [[ -n "${CP_NODE_IP:-}" ]]; then
    # The namespace is ours: the Service port itself, on every address of it.
    api_port=443 bind=0.0.0.0 advertise="${CP_NODE_IP}" authz=Node,RBAC
    node_flags=(--enable-aggregator-routing=true --kubelet-preferred-address-types InternalIP
                --kubelet-client-certificate "${pki}/admin.crt" --kubelet-client-key "${pki}/admin.key")
    # Webhook endpoints for the API server's routing, the CA bundle every pod's service-account
    # volume projects, the node's not-ready taint lifted once its kubelet reports Ready, and
    # claims bound to the PersistentVolumes made for them (case 34).
    controllers+=(endpointslice-controller root-ca-certificate-publisher-controller
                  node-lifecycle-controller persistentvolume-binder-controller)
  fi
  export CP_API_PORT="${api_port}"
  _cp_start etcd "${CP_STATE}/logs/etcd.log" "${bin}/etcd" --name e2e \
    --data-dir "${CP_STATE}/etcd" \
    --listen-client-urls "http://127.0.0.1:${etcd_port}" \
    --advertise-client-urls "http://127.0.0.1:${etcd_port}" \
    --listen-peer-urls "http://127.0.0.1:${etcd_peer}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer}" \
    --initial-cluster "e2e=http://127.0.0.1:${etcd_peer}" \
    --listen-metrics-urls "" --unsafe-no-fsync --log-level warn
  WAIT_PID=${LAST_PID} WAIT_LOG="${CP_STATE}/logs/etcd.log" \
    wait_until 60 "etcd on 127.0.0.1:${etcd_port}" _etcd_healthy "${etcd_port}"

  _cp_start kube-apiserver "${CP_STATE}/logs/kube-apiserver.log" "${bin}/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:${etcd_port}" \
    --bind-address "${bind}" --advertise-address "${advertise}" --secure-port "${api_port}" \
    --tls-cert-file "${pki}/apiserver.crt" --tls-private-key-file "${pki}/apiserver.key" \
    --client-ca-file "${pki}/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "${pki}/sa.pub" \
    --service-account-signing-key-file "${pki}/sa.key" \
    --authorization-mode "${authz}" --anonymous-auth=false "${node_flags[@]}" \
    --allow-privileged=true --service-cluster-ip-range 10.0.0.0/24 \
    --endpoint-reconciler-type none --profiling=false \
    --cert-dir "${CP_STATE}/apiserver-certs" --v 1
  local api_pid=${LAST_PID}
  _cp_kubeconfig "${CP_STATE}/admin.kubeconfig" "https://127.0.0.1:${api_port}" \
    "${pki}/ca.crt" "${pki}/admin.crt" "${pki}/admin.key"
  _cp_kubeconfig "${CP_STATE}/webhook.kubeconfig" "https://127.0.0.1:${api_port}" \
    "${pki}/ca.crt" "${pki}/webhook-client.crt" "${pki}/webhook-client.key"
  export KUBECONFIG="${CP_STATE}/admin.kubeconfig"
  WAIT_PID=${api_pid} WAIT_LOG="${CP_STATE}/logs/kube-apiserver.log" \
    wait_until 180 "kube-apiserver /readyz on 127.0.0.1:${api_port}" k get --raw /readyz --request-timeout=10s

  _cp_start kube-controller-manager "${CP_STATE}/logs/kube-controller-manager.log" \
    "${bin}/kube-controller-manager" --kubeconfig "${KUBECONFIG}" \
    --controllers "$(IFS=,; echo "${controllers[*]}")" --secure-port 0 --leader-elect=false \
    --use-service-account-credentials=false --root-ca-file "${pki}/ca.crt" --v 1
  # The ServiceAccount controller creating `default` shows the controller manager works.
  WAIT_PID=${LAST_PID} WAIT_LOG="${CP_STATE}/logs/kube-controller-manager.log" \
    wait_until 120 "kube-controller-manager (ServiceAccount default/default)" \
    k -n default get serviceaccount default
  CP_START_SECONDS=$((SECONDS - t0))
  e2e_log "control plane up in ${CP_START_SECONDS}s (API server https://127.0.0.1:${api_port})"
}

_wh_metrics_url() { curl -fsS --max-time 10 "${WEBHOOK_METRICS_URL}" >/dev/null; }
_wh_ready() { curl -fsS --max-time 10 --cacert "$1" "$2/readyz" >/dev/null; }


wh_up() {
  CP_STATE="$1"
  local webhook="$2" repo="$3"
  [[ -x "${webhook}" ]] || e2e_die "webhook binary ${webhook} missing: run make build"
  local t0=${SECONDS}
  "${repo}/certs/gen.sh" --out "${CP_STATE}/webhook-certs" --san 127.0.0.1 --san localhost \
    --days 2 >/dev/null || e2e_die "certs/gen.sh failed"
  local port metrics_port
  port="$(free_port)"; metrics_port="$(free_port)"

  # The webhook's namespace and RBAC exactly as manifests/base renders them.
  k kustomize "${repo}/manifests/base" > "${CP_STATE}/base.yaml"
  python3 - "${CP_STATE}/base.yaml" > "${CP_STATE}/rbac.yaml" <<'PY'
import sys, yaml
keep = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] in keep]
yaml.safe_dump_all(docs, sys.stdout)
PY
  k apply -f "${CP_STATE}/rbac.yaml" >/dev/null || e2e_die "could not apply the webhook's RBAC"

  _cp_start kv-offload-webhook "${CP_STATE}/logs/webhook.log" "${webhook}" serve \
    --bind-address 127.0.0.1 --port "${port}" --metrics-port "${metrics_port}" \
    --tls-cert-file "${CP_STATE}/webhook-certs/tls.crt" \
    --tls-key-file "${CP_STATE}/webhook-certs/tls.key" \
    --kubeconfig "${CP_STATE}/webhook.kubeconfig" \
    --agent-image "${E2E_AGENT_IMAGE:-kv-offload/offload-agent:e2e}" --log-format text
  local wh_pid=${LAST_PID}
  export WEBHOOK_URL="https://127.0.0.1:${port}"
  export WEBHOOK_METRICS_URL="http://127.0.0.1:${metrics_port}/metrics"
  WAIT_PID=${wh_pid} WAIT_LOG="${CP_STATE}/logs/webhook.log" \
    wait_until 60 "webhook /readyz on ${WEBHOOK_URL}" \
    _wh_ready "${CP_STATE}/webhook-certs/ca.crt" "${WEBHOOK_URL}"

  python3 "${repo}/e2e/tools/webhook_config_for_url.py" "${WEBHOOK_URL}" \
    "${CP_STATE}/webhook-certs/ca-bundle.crt" < "${CP_STATE}/base.yaml" \
    > "${CP_STATE}/webhook-config.json" || e2e_die "could not rewrite the webhook configuration"
  k apply -f "${CP_STATE}/webhook-config.json" >/dev/null \
    || e2e_die "could not install the webhook configuration"

  WAIT_PID=${wh_pid} WAIT_LOG="${CP_STATE}/logs/webhook.log" wait_for_injection 60
  WH_START_SECONDS=$((SECONDS - t0))
  e2e_log "webhook serving and injecting in ${WH_START_SECONDS}s (${WEBHOOK_URL})"
}

webhook_metrics() { curl -fsS "${WEBHOOK_METRICS_URL}"; }

cp_down() {
  local state="${1:-${CP_STATE:-}}"
  [[ -n "${state}" && -f "${state}/pids" ]] || return 0
  local lines name pid
  mapfile -t lines < <(tac "${state}/pids")
  for line in "${lines[@]}"; do
    read -r name pid <<<"${line}"
    kill -0 "${pid}" 2>/dev/null || continue
    kill -TERM "${pid}" 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    while kill -0 "${pid}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "${pid}" 2>/dev/null; then
      e2e_log "${name} (pid ${pid}) ignored SIGTERM for 15s; killing it"
      kill -KILL "${pid}" 2>/dev/null || true
    fi
    wait "${pid}" 2>/dev/null || true
  done
  : > "${state}/pids"
}
