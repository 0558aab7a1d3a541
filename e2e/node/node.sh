# shellcheck shell=bash
# The e2e node: a real kubelet and kube-scheduler (built by controlplane/build.sh) with Debian's
# containerd, runc and CNI plugins, all inside namespaces the run creates, so that the node
# address, the pod network, the kubelet's iptables rules, ip_forward, its mounts and every
# process stay off the host. Source it after ../lib.sh.
#
#   node_enter ARGS...  (host side) re-runs run.sh as PID 1 of new network, mount and PID
#                       namespaces, then removes the cgroups left behind; returns its exit code
#   node_netns          (inside) loopback, the node address and the kubernetes Service address
#   node_up STATE BIN   (inside) containerd, the images, kubelet, kube-scheduler; waits for Ready
#   node_webhook_up STATE  (inside) the webhook from manifests/overlays/self-signed, injecting
#   node_down STATE     (inside) stops every pod and process the node started, unmounts, cleans
#
# Addresses inside the namespace: the node is NODE_IP on a link of its own, which also holds the
# first address of the Service range, the `kubernetes` Service's ClusterIP: the API server
# listens on it at 443, so pods reach it as in a cluster without kube-proxy. The API server reaches webhook
# pods through their endpoints (--enable-aggregator-routing) and pods on the bridge.

NODE_NAME=kvoffload-e2e-node
NODE_IP=10.233.0.2
NODE_SERVICE_IP=10.0.0.1
NODE_POD_CIDR=10.88.0.0/16
# Host paths the kubelet and containerd use whatever they are told; inside the mount namespace
# each one is a folder of the state directory mounted over it.
NODE_HOST_DIRS=(/var/lib/kubelet /var/lib/cni /var/log/pods /var/log/containers /run/containerd)

node_log() { e2e_log "node: $*"; }

# node_check: what the node needs on this machine, with the fix for each; exits on a miss.
node_check() {
  local miss=()
  [[ $(id -u) -eq 0 ]] || miss+=("root (the kubelet and containerd run as root)")
  command -v unshare >/dev/null || miss+=("unshare (util-linux)")
  local c
  for c in containerd containerd-shim-runc-v2 runc ctr ip iptables; do
    command -v "${c}" >/dev/null || miss+=("${c} (hack/install-deps.sh installs containerd, runc, iptables, iproute2)")
  done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
    || miss+=("CNI plugins in /usr/lib/cni (Debian package containernetworking-plugins)")
  command -v cc >/dev/null || miss+=("a C compiler for the pause program (build-essential)")
  if ((${#miss[@]} > 0)); then
    printf 'e2e: error: the e2e node cannot run here; missing:\n' >&2
    printf '  - %s\n' "${miss[@]}" >&2
    printf 'Run with E2E_NODE=0 to leave the node out (the cases then run against the local control plane only).\n' >&2
    exit 1
  fi
}

# node_enter ARGS...: the host side. Everything the node starts lives in the PID namespace whose
# init is the re-run driver: when it exits, for whatever reason, the kernel kills every process
# left in it, and the network and mount namespaces go with them. What outlives the namespaces is
# removed here: the pods' cgroups. What needs the network (Go modules, Debian packages) is done
# here first, as the namespace has none; inside, build.sh then finds every binary in its cache.
node_enter() {
  node_check
  local id d rc images t0=${SECONDS} bin
  "${E2E_REPO}/e2e/controlplane/build.sh" >/dev/null
  bin="$("${E2E_REPO}/e2e/controlplane/build.sh" kubelet kube-scheduler | tail -n1)"
  e2e_log "node: control plane and node binaries ready in $((SECONDS - t0))s (${bin})"
  E2E_PROMETHEUS_CRDS="$("${E2E_REPO}/e2e/controlplane/prometheus-crds.sh")" \
    || e2e_die "e2e/controlplane/prometheus-crds.sh failed"
  export E2E_PROMETHEUS_CRDS
  t0=${SECONDS}
  # The images carry the tag the manifests deploy, so the webhook is installed exactly as
  # rendered (what case 10 dry-runs again must match it).
  local tag
  tag="$(python3 -c 'import sys, yaml
print(next(i["newTag"] for i in yaml.safe_load(open(sys.argv[1]))["images"] if i["name"] == "kv-offload/webhook"))' \
         "${E2E_REPO}/manifests/base/kustomization.yaml")" \
    || e2e_die "no newTag for kv-offload/webhook in manifests/base/kustomization.yaml"
  images="$(mktemp -d "${TMPDIR:-/tmp}/kvoffload-e2e-images.XXXXXX")"
  # Removed however this side ends (a failed step, a signal before the namespace starts).
  # shellcheck disable=SC2064  # the paths as they are now
  trap "rm -rf '${images}'" EXIT
  if ! "${E2E_REPO}/e2e/node/images.sh" "${E2E_REPO}" "${images}" "${tag}" >"${images}/build.log" 2>&1; then
    tail -n 30 "${images}/build.log" >&2
    rm -rf "${images}"
    e2e_die "building the node's images failed"
  fi
  e2e_log "node: images built in $((SECONDS - t0))s ($(tail -n1 "${images}/build.log"))"
  # vLLM's CPU build for case 33, mounted read-only into its pod: the virtualenv the vLLM tests
  # use (cached by version; built here, where PyPI is reachable, when missing).
  t0=${SECONDS}
  E2E_VLLM_VENV="$("${E2E_REPO}/hack/vllm-venv.sh" | tail -n1)" || e2e_die "hack/vllm-venv.sh failed"
  export E2E_VLLM_VENV
  e2e_log "node: vLLM virtualenv ${E2E_VLLM_VENV} ready in $((SECONDS - t0))s"
  id="kvoffload-e2e-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
  # Mount points only: they stay, empty, after the run. Removing one would unmount it in the
  # namespace of another run that is using it.
  for d in "${NODE_HOST_DIRS[@]}"; do mkdir -p "${d}"; done
  node_make_cgroups "${id}"
  # shellcheck disable=SC2064
  trap "node_remove_cgroups '${id}'; rm -rf '${images}'" EXIT
  E2E_NODE_INSIDE=1 E2E_NODE_ID="${id}" E2E_NODE_IMAGES="${images}" E2E_IMAGE_TAG="${tag}" \
    unshare --net --mount --pid --fork --mount-proc --propagation private -- "$@" &
  NODE_UNSHARE_PID=$!
  # A signal to this side is passed on to the driver inside (it cleans up and exits), and the
  # cgroups are still removed here after it is gone.
  trap '_node_forward TERM' TERM
  trap '_node_forward INT' INT
  while :; do
    rc=0
    wait "${NODE_UNSHARE_PID}" || rc=$?
    kill -0 "${NODE_UNSHARE_PID}" 2>/dev/null || break
  done
  trap - TERM INT
  trap - EXIT
  node_remove_cgroups "${id}"
  rm -rf "${images}"
  return "${rc}"
}

# _node_forward SIGNAL: to the driver, the init of the node's PID namespace (unshare's child).
_node_forward() {
  local pid
  for pid in $(pgrep -P "${NODE_UNSHARE_PID}"); do kill -"$1" "${pid}" 2>/dev/null || true; done
}

# node_make_cgroups ID: the kubelet's cgroupRoot, which it requires to exist, in every
# hierarchy; a new cpuset starts with no CPUs or memory nodes, so it gets its parent's.
node_make_cgroups() {
  local id="$1" h
  for h in $(_node_cgroup_mounts); do
    mkdir -p "${h}/${id}"
    if [[ -f "${h}/cpuset.cpus" && ! -f "${h}/cgroup.subtree_control" ]]; then
      cat "${h}/cpuset.cpus" > "${h}/${id}/cpuset.cpus"
      cat "${h}/cpuset.mems" > "${h}/${id}/cpuset.mems"
    fi
  done
}

# The mount points of the cgroup hierarchies (v1 controllers, the v2 unified tree, or both).
_node_cgroup_mounts() {
  # mountinfo: the file system type follows the "-" that ends the optional fields.
  awk '{for (i = 7; i < NF; i++) if ($i == "-") { if ($(i+1) ~ /^cgroup2?$/) print $5; break }}' \
    /proc/self/mountinfo | sort -u
}

# node_remove_cgroups ID: the cgroup folders of the node's pods in every hierarchy, deepest first
# (empty once their processes are gone).
node_remove_cgroups() {
  local id="$1" h
  for h in $(_node_cgroup_mounts); do
    [[ -d "${h}/${id}" ]] || continue
    find "${h}/${id}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ ! -d "${h}/${id}" ]] || e2e_log "node: could not remove cgroup ${h}/${id} (still in use?)"
  done
}

node_netns() {
  [[ "${E2E_NODE_INSIDE:-0}" == 1 ]] || e2e_die "node_netns runs inside the node's namespaces"
  ip link set lo up
  # A bridge with no ports stands for the node's network card (the kernel may lack the dummy
  # type; the CNI plugin needs bridges anyway).
  ip link add kvoffload0 type bridge
  ip addr add "${NODE_IP}/24" dev kvoffload0
  ip addr add "${NODE_SERVICE_IP}/32" dev kvoffload0
  ip link set kvoffload0 up
}

_node_images() {
  local state="$1"
  local f
  for f in "${E2E_NODE_IMAGES:?node_enter builds the images}"/*.oci.tar; do
    ctr -n k8s.io images import "${f}" >>"${state}/logs/images.log" 2>&1 \
      || { tail -n 20 "${state}/logs/images.log" >&2; e2e_die "ctr images import ${f} failed"; }
  done
}

node_up() {
  local state="$1" bin="$2"
  local n="${state}/node" t0=${SECONDS}
  [[ -x "${bin}/kubelet" && -x "${bin}/kube-scheduler" ]] \
    || e2e_die "${bin}/kubelet or kube-scheduler missing: run e2e/controlplane/build.sh kubelet kube-scheduler"
  mkdir -p "${n}"/{kubelet,cni-cache,pod-logs,container-logs,containerd,cni/net.d,cni-ipam,plugins}
  # Private to this mount namespace: what the kubelet and containerd write at fixed host paths.
  mount --bind "${n}/kubelet" /var/lib/kubelet
  mount --bind "${n}/cni-cache" /var/lib/cni
  mount --bind "${n}/pod-logs" /var/log/pods
  mount --bind "${n}/container-logs" /var/log/containers
  mount -t tmpfs -o mode=0711 tmpfs /run/containerd

  cat > "${n}/cni/net.d/10-kvoffload-e2e.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "kvoffload-e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "${n}/cni-ipam",
            "ranges": [[{"subnet": "${NODE_POD_CIDR}"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
JSON
  local tag="${E2E_IMAGE_TAG:?node_enter sets the image tag}"
  # restrict_oom_score_adj: root here may lack CAP_SYS_RESOURCE, and runc then fails to lower a
  # container's oom_score_adj ("can't get final child's PID from pipe: EOF").
  cat > "${n}/containerd.toml" <<TOML
version = 2
root = "${n}/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/kv-offload/pause:${tag}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "${n}/cni/net.d"
TOML
  _cp_start containerd "${state}/logs/containerd.log" containerd --config "${n}/containerd.toml"
  WAIT_PID=${LAST_PID} WAIT_LOG="${state}/logs/containerd.log" \
    wait_until 60 "containerd" ctr version
  _node_images "${state}"

  local pki="${state}/pki"
  _cp_kubeconfig "${n}/kubelet.kubeconfig" "https://127.0.0.1:${CP_API_PORT}" \
    "${pki}/ca.crt" "${pki}/kubelet.crt" "${pki}/kubelet.key"
  # Ephemeral-storage eviction is what case 31 shows, so the stats behind it are refreshed often;
  # the hard thresholds are low so that a busy shared disk does not put the node under pressure.
  cat > "${n}/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /${E2E_NODE_ID}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: ${NODE_IP}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: ${pki}/ca.crt}
authorization: {mode: AlwaysAllow}
volumePluginDir: ${n}/plugins
volumeStatsAggPeriod: 2s
# Pods are synced (a changed Secret reaches its volume) every 10 s instead of every minute, so
# case 32's certificate rotation is seen within seconds.
syncFrequency: 10s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
evictionPressureTransitionPeriod: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
serializeImagePulls: false
maxPods: 40
YAML
  _cp_start kubelet "${state}/logs/kubelet.log" "${bin}/kubelet" --config "${n}/kubelet.yaml" \
    --kubeconfig "${n}/kubelet.kubeconfig" --hostname-override "${NODE_NAME}" \
    --node-ip "${NODE_IP}" --root-dir /var/lib/kubelet --v 1
  local kubelet_pid=${LAST_PID}
  _cp_start kube-scheduler "${state}/logs/kube-scheduler.log" "${bin}/kube-scheduler" \
    --kubeconfig "${KUBECONFIG}" --leader-elect=false --bind-address 127.0.0.1 \
    --secure-port "$(free_port)" --v 1
  _node_ready() {
    [[ "$(k get node "${NODE_NAME}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
  }
  WAIT_PID=${kubelet_pid} WAIT_LOG="${state}/logs/kubelet.log" \
    wait_until 120 "node ${NODE_NAME} Ready" _node_ready
  NODE_START_SECONDS=$((SECONDS - t0))
  node_log "${NODE_NAME} Ready at ${NODE_IP} in ${NODE_START_SECONDS}s (images, containerd, kubelet)"
}

# node_down STATE: pods first (containerd's tasks), then the processes (cp_down stops them with
# the control plane, last started first); anything left in the PID namespace is killed by the
# kernel when the driver exits. Mounts under the state directory go before it is removed.
node_down() {
  local state="$1"
  if [[ -S /run/containerd/containerd.sock ]]; then
    local t
    for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -n k8s.io tasks kill -s SIGKILL "${t}" >/dev/null 2>&1 || true
    done
  fi
  cp_down "${state}"
  # Every other process of this PID namespace (shims, containers): we are its init.
  if [[ $$ -eq 1 ]]; then kill -KILL -1 2>/dev/null || true; fi
  local m
  while read -r m; do
    umount -l "${m}" 2>/dev/null || true
  done < <(awk -v s="${state}" '$5 ~ "^"s {print $5}' /proc/self/mountinfo | sort -r)
  for m in "${NODE_HOST_DIRS[@]}"; do umount -l "${m}" 2>/dev/null || true; done
  # The unpacked images are most of the state's bytes and nothing to debug with.
  if [[ "${E2E_KEEP:-0}" != 1 ]]; then rm -rf "${state}/node/containerd"; fi
}

# node_webhook_up STATE: the webhook as a platform team installs it: certs/gen.sh and the
# self-signed overlay, applied as rendered (copied into the state directory, so the run writes
# nothing into the repository); the images it names are the ones node_enter built. The API
# server reaches it through its Service.
node_webhook_up() {
  local state="$1" repo="${E2E_REPO}" t0=${SECONDS}
  local m="${state}/manifests"
  mkdir -p "${m}/overlays"
  cp -R "${repo}/manifests/base" "${m}/base"
  cp -R "${repo}/manifests/overlays/self-signed" "${m}/overlays/self-signed"
  rm -rf "${m}/overlays/self-signed/generated"
  "${repo}/certs/gen.sh" --out "${m}/overlays/self-signed/generated" >/dev/null \
    || e2e_die "certs/gen.sh failed"
  k kustomize "${m}/overlays/self-signed" > "${state}/webhook-deploy.yaml" \
    || e2e_die "kustomize of the self-signed overlay failed"
  # The agent image the webhook injects is its --agent-image argument.
  local images
  images="$(python3 - "${state}/webhook-deploy.yaml" <<'PY'
import sys, yaml
deps = [d for d in yaml.safe_load_all(open(sys.argv[1]))
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "kv-offload-webhook"]
c = deps[0]["spec"]["template"]["spec"]["containers"][0]
agent = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--agent-image=")]
print(c["image"], agent[0] if agent else "")
PY
)" || e2e_die "no Deployment kv-offload-webhook in the rendered overlay"
  local webhook_image agent_image have i
  read -r webhook_image agent_image <<<"${images}"
  # Listed once, then searched (grep -q on the pipe would cut ctr off and fail under pipefail).
  have="$(ctr -n k8s.io images ls -q)"
  for i in "${webhook_image}" "${agent_image}"; do
    grep -qx "docker.io/${i}" <<<"${have}" \
      || e2e_die "the manifests deploy ${i}, which the node does not have (it has: $(grep -v sha256 <<<"${have}" | tr '\n' ' '))"
  done
  export E2E_AGENT_IMAGE="${agent_image}"
  export E2E_WEBHOOK_CERTS="${m}/overlays/self-signed/generated" E2E_WEBHOOK_OVERLAY="${m}/overlays/self-signed"
  export E2E_STANDIN_IMAGE="docker.io/kv-offload/e2e-standin:${E2E_IMAGE_TAG}"
  # Server-side, under the field manager case 10 dry-runs every overlay with: its certificates
  # differ from these, and an apply by another manager would conflict on the Secret's data.
  k apply --server-side --field-manager kv-offload-e2e -f "${state}/webhook-deploy.yaml" >/dev/null \
    || e2e_die "applying the manifests failed"
  k -n kv-offload-system rollout status deployment/kv-offload-webhook --timeout 180s >&2 \
    || { k -n kv-offload-system get pods -o wide >&2; k -n kv-offload-system describe pods >&2
         e2e_die "the webhook Deployment did not become ready"; }
  WAIT_LOG="${state}/logs/kube-apiserver.log" wait_for_injection 120
  WH_START_SECONDS=$((SECONDS - t0))
  node_log "webhook Deployment serving and injecting through its Service in ${WH_START_SECONDS}s"
}

webhook_metrics() { webhook_metrics_through_api; }
