#!/usr/bin/env bash
# Prints the bin directory of a Go toolchain that can build the pinned Kubernetes release
# (e2e/controlplane/versions.env: KVOFFLOAD_GO_MIN and up). A `go` in PATH or in /usr/local/go
# that is recent enough is used as it is. Otherwise (Debian 12's golang is 1.19) the pinned
# release is fetched once, as the module golang.org/toolchain, from the Go module proxy: the
# same place, and the same bytes, that `go` itself downloads a newer toolchain from with
# GOTOOLCHAIN. Its module hash (h1:, as go.sum records it and sum.golang.org publishes it) is
# checked before anything is unpacked into the cache, keyed by version and architecture.
#
#   KVOFFLOAD_CACHE   cache root (default /var/cache/kv-offload, else ~/.cache/kv-offload)
#   GOPROXY           the first proxy in it is used (default https://proxy.golang.org)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../e2e/controlplane/versions.env
source "${here}/../e2e/controlplane/versions.env"
die() { echo "go-toolchain.sh: error: $*" >&2; exit 1; }

# go_ok GO: whether that go runs and is at least KVOFFLOAD_GO_MIN.
go_ok() {
  local v
  v="$("$1" env GOVERSION 2>/dev/null)" || return 1
  v="${v#go}"
  [[ "$(printf '%s\n%s\n' "${KVOFFLOAD_GO_MIN}" "${v}" | sort -V | head -n1)" == "${KVOFFLOAD_GO_MIN}" ]]
}
for go in "$(command -v go || true)" /usr/local/go/bin/go; do
  if [[ -n "${go}" && -x "${go}" ]] && go_ok "${go}"; then
    dirname "$(readlink -f "${go}")"
    exit 0
  fi
done

case "$(uname -m)" in
  x86_64) arch=amd64 want="${KVOFFLOAD_GO_H1_AMD64}" ;;
  aarch64) arch=arm64 want="${KVOFFLOAD_GO_H1_ARM64}" ;;
  *) die "no pinned Go toolchain for $(uname -m): install Go ${KVOFFLOAD_GO_MIN} or newer in PATH" ;;
esac
if [[ -n "${KVOFFLOAD_CACHE:-}" ]]; then
  root="${KVOFFLOAD_CACHE}"
elif mkdir -p /var/cache/kv-offload 2>/dev/null && [[ -w /var/cache/kv-offload ]]; then
  root=/var/cache/kv-offload
else
  root="${HOME}/.cache/kv-offload"
fi
version="v0.0.1-go${KVOFFLOAD_GO_VERSION}.linux-${arch}"
dest="${root}/go-${KVOFFLOAD_GO_VERSION}-linux-${arch}"
mkdir -p "${root}"
exec 9>"${dest}.lock"
flock 9
if [[ ! -f "${dest}/.kvoffload-ready" ]]; then
  proxy="${GOPROXY:-https://proxy.golang.org}"
  proxy="${proxy%%[,|]*}"
  [[ "${proxy}" == http* ]] || proxy=https://proxy.golang.org
  zip="${dest}.zip"
  echo "go-toolchain.sh: fetching Go ${KVOFFLOAD_GO_VERSION} (${arch}) from ${proxy}" >&2
  curl -fsSL --retry 3 -o "${zip}.tmp" "${proxy}/golang.org/toolchain/@v/${version}.zip" \
    || die "downloading ${proxy}/golang.org/toolchain/@v/${version}.zip failed"
  mv "${zip}.tmp" "${zip}"
  rm -rf "${dest}"
  # The module hash is checked over the zip's entries before one of them is written out.
  python3 - "${zip}" "${want}" "golang.org/toolchain@${version}/" "${dest}" <<'PY' \
    || { rm -f "${zip}"; die "the Go toolchain from the proxy did not check out (see above)"; }
import base64, hashlib, os, sys, zipfile
path, want, prefix, dest = sys.argv[1:]
z = zipfile.ZipFile(path)
names = sorted(z.namelist())
summary = "".join(f"{hashlib.sha256(z.read(n)).hexdigest()}  {n}\n" for n in names)
got = "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()
if got != want:
    sys.exit(f"go-toolchain.sh: {path}: module hash {got}, pinned {want}")
for info in z.infolist():
    if not info.filename.startswith(prefix) or info.is_dir():
        continue
    out = os.path.join(dest, info.filename[len(prefix):])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with z.open(info) as src, open(out, "wb") as dst:
        dst.write(src.read())
    os.chmod(out, (info.external_attr >> 16) & 0o777 or 0o644)
PY
  rm -f "${zip}"
  go_ok "${dest}/bin/go" || die "${dest}/bin/go does not run"
  touch "${dest}/.kvoffload-ready"
fi
echo "${dest}/bin"
