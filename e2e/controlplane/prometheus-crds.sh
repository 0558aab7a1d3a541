#!/usr/bin/env bash
# Prints the directory of the Prometheus Operator's CRDs (PrometheusRule, PodMonitor) that
# manifests/monitoring is dry-run against (e2e case 10): the operator's Go module at the pinned
# version, fetched through the module proxy into Go's module cache when it is not there yet.
# Needs the proxy only then: the node's namespaces have no network, so node_enter runs this
# first, on the host side (a cold CI run failed case 10 with "network is unreachable").
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=e2e/controlplane/versions.env
source "${repo}/e2e/controlplane/versions.env"
mod="github.com/prometheus-operator/prometheus-operator@${KVOFFLOAD_PROMETHEUS_OPERATOR_VERSION}"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
go_bin="$("${repo}/hack/go-toolchain.sh")"
# `go mod download -json` reports a failure in its JSON on stdout, so the answer is kept and
# its "Error" shown; the proxy is a remote service, so a failed fetch is tried three times, as
# go-toolchain.sh's curl is.
for attempt in 1 2 3; do
  (cd "${work}" && PATH="${go_bin}:${PATH}" GOFLAGS='' go mod download -json "${mod}") \
    > "${work}/download.json" 2>&1 && break
  ((attempt < 3)) && sleep 5
done
dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "${work}/download.json")/example/prometheus-operator-crd"
if [[ ! -d "${dir}" ]]; then
  echo "prometheus-crds.sh: could not download ${mod}: $(grep '"Error"' "${work}/download.json" ||
                                                         tail -n 5 "${work}/download.json")" >&2
  exit 1
fi
echo "${dir}"
