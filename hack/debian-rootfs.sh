#!/usr/bin/env bash
# debian-rootfs.sh PACKAGE...: a minimal root file system made of the data of Debian packages, for
# images built without a registry (hack/oci-image.py). Prints its directory on the last line.
#
# Each package is fetched with `apt-get download` (the machine's own apt sources and versions) and
# unpacked with `dpkg-deb -x`; no maintainer script runs, so the few links those scripts would
# make (/bin/sh, /usr/bin/python3) are made here. The list is not dependency-resolved: callers
# name every library their programs load, and smoke-test the result (see e2e/node/images.sh).
# Cached by the exact package versions under ${KVOFFLOAD_CACHE:-/var/cache/kv-offload}/rootfs.
set -euo pipefail

die() { echo "debian-rootfs: error: $*" >&2; exit 1; }
(($# > 0)) || die "usage: debian-rootfs.sh PACKAGE..."
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
  || die "apt-get and dpkg-deb are needed (a Debian or Ubuntu machine)"

cache="${KVOFFLOAD_CACHE:-/var/cache/kv-offload}"
if ! mkdir -p "${cache}" 2>/dev/null || [[ ! -w "${cache}" ]]; then cache="${HOME}/.cache/kv-offload"; fi
mkdir -p "${cache}/debs" "${cache}/rootfs"

# Package lists older than the mirror name versions it no longer has (a security update
# superseded them: apt-get download gets a 404), and a machine whose lists were removed has no
# candidate at all: then, as root, the lists are refreshed once and everything resolved again.
updated=0
refresh_lists() {
  ((updated == 0)) && [[ $(id -u) -eq 0 ]] || return 1
  updated=1
  echo "debian-rootfs: refreshing the package lists (apt-get update)" >&2
  apt-get update -qq -o DPkg::Lock::Timeout=600 >&2 || die "apt-get update failed"
}

# The key is every package's candidate version, so a point release makes a new root file system.
# One apt-cache call for all of them: "name:" lines, each followed by its "Candidate:".
resolve() {
  local name version p v
  declare -gA candidate=()
  while read -r name version; do
    candidate["${name}"]="${version}"
  done < <(apt-cache policy "$@" 2>/dev/null | awk '/^[^ ].*:$/ {n = substr($1, 1, length($1) - 1)}
                                                   /^  Candidate:/ {print n, $2}')
  versions=()
  for p in "$@"; do
    v="${candidate[${p}]:-}"
    [[ -n "${v}" && "${v}" != "(none)" ]] || return 1
    versions+=("${p}=${v}")
  done
  key="$(printf '%s\n' "${versions[@]}" | sort | sha256sum | cut -c1-16)"
  out="${cache}/rootfs/${key}"
}
if ! resolve "$@"; then
  refresh_lists && resolve "$@" \
    || die "a package of '$*' has no candidate version (fix the name, or the apt sources)"
fi
if [[ -f "${out}/.complete" ]]; then
  echo "${out}"
  exit 0
fi

exec 9>"${cache}/rootfs/.lock"
flock 9
if [[ ! -f "${out}/.complete" ]]; then
  # apt-get download writes into the working directory; as root it warns that the _apt user
  # cannot write there, which is harmless.
  download() {
    local pv p v
    missing=()
    for pv in "${versions[@]}"; do
      p="${pv%%=*}" v="${pv#*=}"
      compgen -G "${cache}/debs/${p}_${v//:/%3a}_*.deb" >/dev/null || missing+=("${pv}")
    done
    ((${#missing[@]} == 0)) \
      || (cd "${cache}/debs" && apt-get download -q "${missing[@]}" 2>&1 | { grep -v "unsandboxed" || true; } >&2)
  }
  if ! download; then
    refresh_lists && resolve "$@" && download || die "apt-get download ${missing[*]} failed"
  fi
  rm -rf "${out}"
  mkdir -p "${out}/tree"
  for pv in "${versions[@]}"; do
    p="${pv%%=*}" v="${pv#*=}"
    deb="$(ls "${cache}/debs/${p}_${v//:/%3a}_"*.deb 2>/dev/null | head -n1)"
    [[ -n "${deb}" ]] || die "no .deb for ${pv} in ${cache}/debs after apt-get download"
    dpkg-deb -x "${deb}" "${out}/tree"
  done
  # What maintainer scripts would have linked.
  t="${out}/tree"
  if [[ -x "${t}/bin/dash" && ! -e "${t}/bin/sh" ]]; then ln -s dash "${t}/bin/sh"; fi
  if [[ ! -e "${t}/usr/bin/python3" ]]; then
    for py in "${t}"/usr/bin/python3.[0-9] "${t}"/usr/bin/python3.[0-9][0-9]; do
      if [[ -x "${py}" ]]; then ln -s "$(basename "${py}")" "${t}/usr/bin/python3"; break; fi
    done
  fi
  mkdir -p "${t}/tmp" "${t}/proc" "${t}/sys" "${t}/dev" "${t}/etc"
  chmod 1777 "${t}/tmp"
  # Documentation is most of the bytes of a small package and no program reads it.
  rm -rf "${t}/usr/share/doc" "${t}/usr/share/man" "${t}/usr/share/info" "${t}/usr/share/locale"
  printf '%s\n' "${versions[@]}" > "${out}/packages"
  touch "${out}/.complete"
fi
echo "${out}"
