#!/usr/bin/env bash
# images.sh REPO OUT TAG: the e2e node's images as OCI archives in OUT, built without a registry
# or a container engine (hack/oci-image.py over Debian packages from hack/debian-rootfs.sh):
#   webhook.oci.tar        docker.io/kv-offload/webhook:TAG        glibc + dist/webhook
#   offload-agent.oci.tar  docker.io/kv-offload/offload-agent:TAG  a slim Debian + dist/offload-agent
#   e2e-standin.oci.tar    docker.io/kv-offload/e2e-standin:TAG    the same Debian with Python,
#                          bash and the libraries vLLM's CPU build loads, plus e2e/node/standin
#                          (a `vllm` that runs the agent, no vLLM; the real one comes from a mount)
#   pause.oci.tar          docker.io/kv-offload/pause:TAG          e2e/node/pause.c, static
# The webhook and agent images take their Entrypoint, Cmd, Env and User from the Dockerfiles that
# `make images` builds with docker/podman from the same staged trees (make webhook-dist agent-dist).
set -euo pipefail
repo="${1:?usage: images.sh REPO OUT TAG}" out="${2:?usage: images.sh REPO OUT TAG}" tag="${3:?}"
dist="${DIST:-${repo}/dist}"
die() { echo "images.sh: error: $*" >&2; exit 1; }
for d in "${dist}/webhook/usr/local/bin" "${dist}/offload-agent/opt/kvoffload/lib"; do
  [[ -d "${d}" ]] || die "${d} missing: run make webhook-dist agent-dist"
done
mkdir -p "${out}"
t0=${SECONDS}

# The distroless runtime of the webhook image is glibc; the staged tree carries the rest.
glibc="$("${repo}/hack/debian-rootfs.sh" libc6 | tail -n1)/tree"
# debian:12-slim for the agent image, with Python for the stand-in (which installs nothing:
# kvoffload comes from the agent volume, as in a real pod). Every shared library the programs
# load is named; the smoke test below fails when one is missing.
# No liburing2 nor libisal2: vLLM images carry neither, so the stand-in must load them from the
# agent volume, as a real vLLM pod does.
slim_pkgs=(libc6 libgcc-s1 libstdc++6 dash bash libtinfo6 coreutils libacl1 libattr1
           libgmp10 libselinux1 libpcre2-8-0
           python3-minimal python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libffi8
           zlib1g libexpat1 libbz2-1.0 liblzma5 libssl3 libcrypt1)
slim="$("${repo}/hack/debian-rootfs.sh" "${slim_pkgs[@]}" | tail -n1)/tree"
# The stand-in image also runs the real vLLM CPU build from the host's cached virtualenv (case
# 33, mounted read-only): the shared libraries its wheels and the interpreter load beyond the
# agent's, found with readelf over the venv (libnuma for vLLM's CPU kernels, libgomp for torch,
# sqlite3 for vLLM's structured output, readline/ncurses/uuid/tirpc for the interpreter's own
# modules) and lscpu, which vLLM's CPU platform runs to learn the topology. They stay out of
# the agent image, which only needs what libkvoffload loads. KServe's launch script runs awk
# (mawk, whose /usr/bin/awk link Debian's alternatives make in a maintainer script, which the
# unpacked root file system skips: the stand-in layer carries the link).
standin_pkgs=("${slim_pkgs[@]}" libsqlite3-0 libnuma1 libgomp1 libuuid1 libncursesw6 libreadline8
              libtirpc3 libtirpc-common libnsl2 libelf1 util-linux libsmartcols1 mawk)
standin="$("${repo}/hack/debian-rootfs.sh" "${standin_pkgs[@]}" | tail -n1)/tree"
if command -v chroot >/dev/null && [[ $(id -u) -eq 0 ]]; then
  chroot "${slim}" /usr/bin/python3 -c 'import ctypes, json, hashlib, mmap' \
    || die "the Debian root file system ${slim} cannot run Python: a package is missing"
  chroot "${slim}" /bin/sh -c 'cp --version >/dev/null' || die "${slim}: sh or cp does not run"
fi

work="$(mktemp -d "${out}/.work.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
mkdir -p "${work}/standin/usr/local/bin" "${work}/pause"
install -m 0755 "${repo}/e2e/node/standin/vllm" "${work}/standin/usr/local/bin/vllm"
mkdir -p "${work}/standin/usr/bin"
ln -s mawk "${work}/standin/usr/bin/awk"
cc -static -O2 -Wall -Wextra -Werror -o "${work}/pause/pause" "${repo}/e2e/node/pause.c" \
  || die "building the static pause program failed (needs libc6-dev's static libc)"

oci="${repo}/hack/oci-image.py"
python3 "${oci}" --name "docker.io/kv-offload/webhook:${tag}" --dockerfile "${repo}/webhook/Dockerfile" \
  --layer "${glibc}" --layer "${dist}/webhook" --out "${out}/webhook.oci.tar"
python3 "${oci}" --name "docker.io/kv-offload/offload-agent:${tag}" \
  --dockerfile "${repo}/offload-agent/Dockerfile" \
  --layer "${slim}" --layer "${dist}/offload-agent" --out "${out}/offload-agent.oci.tar"
python3 "${oci}" --name "docker.io/kv-offload/e2e-standin:${tag}" \
  --layer "${standin}" --layer "${work}/standin" --entrypoint '["/usr/local/bin/vllm"]' \
  --env PYTHONUNBUFFERED=1 --out "${out}/e2e-standin.oci.tar"
python3 "${oci}" --name "docker.io/kv-offload/pause:${tag}" --layer "${work}/pause" \
  --entrypoint '["/pause"]' --user 65535 --out "${out}/pause.oci.tar"
echo "images.sh: 4 images in ${out} in $((SECONDS - t0))s"
