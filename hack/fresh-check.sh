#!/usr/bin/env bash
# fresh-check.sh [--setup-only]: the README's first-screen commands on a fresh Debian 12, as root.
#
# Builds a root file system with debootstrap (variant minbase, plus make and git: nothing else
# the project needs is there, no compiler, no Python, no Go), clones the committed HEAD of this
# repository into it, and runs in a chroot, inside a mount namespace of its own:
#   full (default)   make test && make demo (DEMO_ONCE=1: it exits when it has shown its pod)
#   --setup-only     hack/install-deps.sh, the Go toolchain and make build: the set-up half,
#                    which is what a fresh machine gets wrong (a missing package, an old Go)
# Package, Go-module, Go-build, pip/uv and compiler (ccache) caches are bound in from this machine
# so that a run takes minutes, not an hour; no build tree, control plane binary or vLLM
# virtualenv is shared. The clone sits at this repository's own path inside the root, so a
# compile whose sources, headers, flags and compiler are identical to one this machine did comes
# from ccache; anything the fresh root has differently (a header, a package version) compiles. Needs root and debootstrap (installed when missing); where chroot or
# mounts are not allowed it says so and fails, it never passes without having run.
#
#   FRESH_DIR    where the root lives while the check runs: FRESH_DIR.XXXXXX (default
#                /var/tmp/kvoffload-fresh.XXXXXX)
#   FRESH_KEEP=1 keep it afterwards
#   FRESH_CTEST_EXCLUDE  a ctest -E regular expression: tests the root's `make test` leaves out
#                (.ci/run names the vLLM engine files that its own `make test` has just run)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=full
case "${1:-}" in
  "") ;;
  --setup-only) mode=setup ;;
  *) echo "fresh-check.sh: error: unknown argument '$1' (the only one is --setup-only)" >&2; exit 1 ;;
esac
die() { echo "fresh-check.sh: error: $*" >&2; exit 1; }
log() { echo "fresh-check.sh: $*" >&2; }
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot and bind mounts)"
# Single-quoted inside make's CTEST_FLAGS below, and make expands $.
[[ "${FRESH_CTEST_EXCLUDE:-}" != *[\'\$]* ]] || die "FRESH_CTEST_EXCLUDE may hold no ' or \$"
command -v unshare >/dev/null || die "needs unshare (util-linux)"
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
    --no-install-recommends debootstrap >/dev/null \
    || die "installing debootstrap failed"
fi

cache="${KVOFFLOAD_CACHE:-/var/cache/kv-offload}"
# A directory of this run's own: two runs on one machine each removed the other's root, one
# of them while chrooted in it. Removed on any exit, unless FRESH_KEEP=1.
dir="$(mktemp -d "${FRESH_DIR:-/var/tmp/kvoffload-fresh}.XXXXXX")"
if [[ "${FRESH_KEEP:-0}" != 1 ]]; then trap 'rm -rf "${dir}"' EXIT; fi
root="${dir}/root"
# The mirror this machine's apt uses for bookworm itself (deb822 or one-line sources), so the
# root gets the same Debian the rest of the project is built against. Without a *.sources file
# (the installer writes only sources.list) the pipeline failed under pipefail and the script
# exited without a word; another repository's stanza (a vendor's) is not Debian's.
mirror="$(awk 'FNR == 1 {uri = ""; suites = ""}
               /^URIs:/ {uri = $2} /^Suites:/ {suites = $0}
               /^$/ {if (uri != "" && suites ~ /[ \t]bookworm([ \t]|$)/) {print uri; exit} uri = ""; suites = ""}
               END {if (uri != "" && suites ~ /[ \t]bookworm([ \t]|$)/) print uri}' \
            /dev/null /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)"
[[ -n "${mirror}" ]] || mirror="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
mirror="${mirror:-http://deb.debian.org/debian}"

t0=${SECONDS}
mkdir -p "${root}" "${cache}/fresh-debootstrap" "${cache}/fresh-apt-archives/partial"
log "debootstrap bookworm (minbase + make, git) from ${mirror}"
debootstrap --variant=minbase --include=make,git --cache-dir="${cache}/fresh-debootstrap" \
  bookworm "${root}" "${mirror}" >"${dir}/debootstrap.log" 2>&1 \
  || { tail -n 20 "${dir}/debootstrap.log" >&2; die "debootstrap failed (log: ${dir}/debootstrap.log)"; }
log "root ready in $((SECONDS - t0)) s"
# The site's network settings come along, as a user's machine has them: its resolver and hosts, the
# local CA certificates that ca-certificates adds to the bundle when install-deps installs it
# (a proxy that inspects TLS needs them), and the proxy and CA-bundle variables set here.
cp /etc/resolv.conf "${root}/etc/resolv.conf"
# debootstrap writes no /etc/hosts, which every installed machine has (the installer or
# cloud-init writes it): without it the machine's own hostname does not resolve.
cp /etc/hosts "${root}/etc/hosts"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "${root}/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "${root}/usr/local/share/ca-certificates/"
fi
site_env=()
# CI too: with CI=true (.ci/run) a test whose capability the fresh root lacks fails there
# instead of being reported as skipped, as it would on the machine itself.
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY SSL_CERT_FILE SSL_CERT_DIR \
         CURL_CA_BUNDLE REQUESTS_CA_BUNDLE PIP_CERT GIT_SSL_CAINFO CI; do
  [[ -n "${!v:-}" ]] && site_env+=("${v}=${!v}")
done
git clone --quiet "${repo}" "${root}${repo}"
log "cloned $(git -C "${repo}" rev-parse --short HEAD) (committed state only) into ${root}${repo}"

# Caches bound in: what a user would also keep between attempts. A folder this machine lacks is
# created so the bind works (an empty cache is a cold one, which is still a valid check).
gomod="$(command -v go >/dev/null && go env GOMODCACHE || echo /root/go/pkg/mod)"
gobuild="$(command -v go >/dev/null && go env GOCACHE || echo /root/.cache/go-build)"
ccache_dir="$(command -v ccache >/dev/null && ccache -k cache_dir || echo /root/.cache/ccache)"
binds=("${cache}/fresh-apt-archives:/var/cache/apt/archives" "${gomod}:/root/go/pkg/mod"
       "${gobuild}:/root/.cache/go-build" "/root/.cache/pip:/root/.cache/pip" "/root/.cache/uv:/root/.cache/uv"
       "${ccache_dir}:/root/.cache/ccache")

if [[ "${mode}" == setup ]]; then
  inner='hack/install-deps.sh && PATH="$(hack/go-toolchain.sh):${PATH}" go version && make build'
else
  # DEMO_ONCE=1: the demo exits once it has shown the injected pod, where a user would
  # look and press Ctrl-C.
  inner='make test && DEMO_ONCE=1 make demo'
  if [[ -n "${FRESH_CTEST_EXCLUDE:-}" ]]; then
    # make hands the recipe to a shell: the expression is single-quoted inside CTEST_FLAGS.
    inner="make test CTEST_FLAGS=$(printf '%q' "-E '${FRESH_CTEST_EXCLUDE}'") && DEMO_ONCE=1 make demo"
  fi
fi
# Everything mounted here ends with the namespace; the root is removed afterwards.
rc=0
unshare --mount --propagation private -- bash -euo pipefail -c '
root="$1" inner="$2" site_env="$3" workdir="$4"; shift 4
# The root bound onto itself first, so that / in the chroot is a mount point, as on a machine:
# a test that makes / private in a mount namespace of its own (tier_test.cc, mounting over a
# block file) otherwise gets EINVAL and is skipped here.
mount --bind "${root}" "${root}"
mount -t proc proc "${root}/proc"
mount --rbind /sys "${root}/sys"
mount --rbind /dev "${root}/dev"
for b in "$@"; do
  src="${b%%:*}" dst="${root}${b#*:}"
  mkdir -p "${src}" "${dst}"
  mount --bind "${src}" "${dst}"
done
# shellcheck disable=SC2086  # site_env: NAME=VALUE words, none with spaces
exec chroot "${root}" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${site_env} \
  /bin/bash -euo pipefail -c "cd \"${workdir}\" && ${inner}"
' fresh "${root}" "${inner}" "${site_env[*]}" "${repo}" "${binds[@]}" || rc=$?

if ((rc != 0)); then
  die "'${inner}' failed with exit ${rc} in a fresh Debian 12 root ($((SECONDS - t0)) s)"
fi
log "passed: '${inner}' in a fresh Debian 12 root in $((SECONDS - t0)) s"
