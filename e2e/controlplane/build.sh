#!/usr/bin/env bash
# Builds the local control plane binaries (kube-apiserver, kube-controller-manager, kubectl, etcd)
# and, when asked, the node's (kubelet, kube-scheduler) from Go modules through the module proxy,
# into a cache keyed by version outside the repo.
# Idempotent: a binary already in the cache is kept; only missing ones are built.
# Prints the bin directory on the last line of stdout.
#
#   KVOFFLOAD_CACHE   cache root (default /var/cache/kv-offload, else ~/.cache/kv-offload)
#   K8S_VERSION       k8s.io/kubernetes release (default in versions.env)
#   ETCD_VERSION      go.etcd.io/etcd/server/v3 release (default in versions.env)
#   GO_BUILD_PAR      go build -p (default 2; the machine is shared)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"
K8S_VERSION="${K8S_VERSION:-${KVOFFLOAD_K8S_VERSION}}"
ETCD_VERSION="${ETCD_VERSION:-${KVOFFLOAD_ETCD_VERSION}}"
par="${GO_BUILD_PAR:-2}"

log() { echo "build.sh: $*" >&2; }
die() { echo "build.sh: error: $*" >&2; exit 1; }

# Go is needed only when something is built: an installed one recent enough, else the pinned
# toolchain hack/go-toolchain.sh fetches once into the cache (Debian 12's golang is too old).
need_go() {
  [[ -n "${_go_bin:-}" ]] && return
  _go_bin="$("${here}/../../hack/go-toolchain.sh")" || die "no Go toolchain (hack/go-toolchain.sh failed)"
  export PATH="${_go_bin}:${PATH}"
}

cache_root() {
  if [[ -n "${KVOFFLOAD_CACHE:-}" ]]; then echo "${KVOFFLOAD_CACHE}"; return; fi
  if mkdir -p /var/cache/kv-offload 2>/dev/null && [[ -w /var/cache/kv-offload ]]; then
    echo /var/cache/kv-offload
  else
    echo "${HOME}/.cache/kv-offload"
  fi
}
root="$(cache_root)"
k8s_dir="${root}/k8s-${K8S_VERSION}"
etcd_dir="${root}/etcd-${ETCD_VERSION}"
bin="${root}/bin-${K8S_VERSION}-etcd-${ETCD_VERSION}"
mkdir -p "${k8s_dir}/bin" "${etcd_dir}/bin" "${bin}"
# One build at a time per cache (ctest's kubectl and make e2e may start together): the second
# waits, then finds the binaries there.
if command -v flock >/dev/null; then
  exec 9>"${root}/.build.lock"
  flock 9
fi

export GOFLAGS="-p=${par} -mod=mod"
export CGO_ENABLED=0
ldflags_common="-s -w"

# k8s.io/kubernetes as a dependency needs every staging module replaced by its published
# v0.<minor>.<patch> twin; the list is read from that release's own go.mod.
# Every command the module graph must resolve; a cache prepared for fewer is resolved again.
k8s_cmds=(kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler)
# The module proxy is a remote service, and a cold build fetches hundreds of modules: a command
# that fetches from it is tried three times (one 5xx turned the whole run red).
three_tries() {
  local attempt
  for attempt in 1 2 3; do
    "$@" && return 0
    ((attempt == 3)) || sleep 5
  done
  return 1
}
prepare_k8s_module() {
  local mod="${k8s_dir}/src"
  [[ -f "${mod}/go.sum" && -f "${mod}/.ready" && "$(cat "${mod}/.ready")" == "${k8s_cmds[*]}" ]] \
    && return 0
  need_go
  mkdir -p "${mod}"
  local gomod staging_ver
  # `go mod download -json` reports a failure in its JSON on stdout: kept, and its "Error" shown.
  # shellcheck disable=SC2016  # expanded by the inner bash
  three_tries bash -c 'cd "$1" && GOFLAGS="" go mod download -json "$2" > download.json 2>&1' \
    _ "${mod}" "k8s.io/kubernetes@${K8S_VERSION}" || true
  gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' "${mod}/download.json")"
  [[ -f "${gomod}" ]] || die "could not download k8s.io/kubernetes@${K8S_VERSION}: $(
    grep '"Error"' "${mod}/download.json" || tail -n 5 "${mod}/download.json")"
  staging_ver="v0.${K8S_VERSION#v1.}"
  {
    echo "module kvoffload.local/controlplane"
    echo
    grep -E '^go [0-9]' "${gomod}"
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    echo "replace ("
    grep -oE 'k8s\.io/[a-z0-9._/-]+ => \./staging/src/k8s\.io/[a-z0-9._/-]+' "${gomod}" \
      | awk -v v="${staging_ver}" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > "${mod}/go.mod"
  grep -q '=> k8s.io/api ' "${mod}/go.mod" || die "no staging replace block found in ${gomod}"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${k8s_cmds[@]}"
    printf ')\n'
  } > "${mod}/tools.go"
  log "resolving k8s.io/kubernetes ${K8S_VERSION} module graph"
  # shellcheck disable=SC2016
  three_tries bash -c 'cd "$1" && go mod tidy' _ "${mod}" \
    || die "go mod tidy failed for k8s.io/kubernetes ${K8S_VERSION}"
  echo "${k8s_cmds[*]}" > "${mod}/.ready"
}

build_k8s() {
  local name="$1" pkg="k8s.io/kubernetes/cmd/$1"
  [[ -x "${k8s_dir}/bin/${name}" ]] && return 0
  need_go
  prepare_k8s_module
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local vf="-X k8s.io/component-base/version.gitVersion=${K8S_VERSION}"
  vf+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
  vf+=" -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION}"
  vf+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${minor}"
  log "building ${name} ${K8S_VERSION} (go build -p ${par}; cold builds take tens of minutes)"
  local t0=${SECONDS}
  (cd "${k8s_dir}/src" && go build -trimpath -ldflags="${ldflags_common} ${vf}" \
      -o "${k8s_dir}/bin/.${name}.tmp" "${pkg}") || die "go build ${pkg} failed"
  mv -f "${k8s_dir}/bin/.${name}.tmp" "${k8s_dir}/bin/${name}"
  log "built ${name} in $((SECONDS - t0))s"
}

build_etcd() {
  [[ -x "${etcd_dir}/bin/etcd" ]] && return 0
  local mod="${etcd_dir}/src"
  need_go
  mkdir -p "${mod}"
  if [[ ! -f "${mod}/.ready" ]]; then
    cat > "${mod}/go.mod" <<MOD
module kvoffload.local/etcd

go 1.24

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
MOD
    cat > "${mod}/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
    log "resolving etcd ${ETCD_VERSION} module graph"
    # shellcheck disable=SC2016
    three_tries bash -c 'cd "$1" && go mod tidy' _ "${mod}" || die "go mod tidy failed for etcd ${ETCD_VERSION}"
    touch "${mod}/.ready"
  fi
  log "building etcd ${ETCD_VERSION}"
  local t0=${SECONDS}
  (cd "${mod}" && go build -trimpath -ldflags="${ldflags_common}" \
      -o "${etcd_dir}/bin/.etcd.tmp" go.etcd.io/etcd/server/v3) || die "go build etcd failed"
  mv -f "${etcd_dir}/bin/.etcd.tmp" "${etcd_dir}/bin/etcd"
  log "built etcd in $((SECONDS - t0))s"
}

# Order: kubectl first (make test's kustomize check needs only it), then etcd, then the servers.
# The node's binaries (kubelet, kube-scheduler) only when named: `build.sh kubelet kube-scheduler`.
for what in "${@:-kubectl etcd kube-apiserver kube-controller-manager}"; do
  for w in ${what}; do
    case "${w}" in
      etcd) build_etcd; ln -sf "${etcd_dir}/bin/etcd" "${bin}/etcd" ;;
      kubectl|kube-apiserver|kube-controller-manager|kubelet|kube-scheduler)
        build_k8s "${w}"; ln -sf "${k8s_dir}/bin/${w}" "${bin}/${w}" ;;
      *) die "unknown binary ${w}" ;;
    esac
  done
done
echo "${bin}"
