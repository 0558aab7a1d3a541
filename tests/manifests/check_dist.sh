#!/usr/bin/env bash
# check_dist.sh webhook|agent BUILD: runs the image payload staging that the Dockerfiles run
# (make webhook-dist / agent-dist) into a scratch directory and checks the result, so CI
# exercises the image build steps without a container engine.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
what="$1" build="$2"
out="$(mktemp -d)"
trap 'rm -rf "${out}"' EXIT
case "${what}" in
  webhook)
    "${repo}/hack/stage-webhook.sh" "${build}" "${out}"
    bin="${out}/usr/local/bin/kv-offload-webhook"
    # Only the staged libraries plus glibc: what the distroless runtime offers.
    missing="$(env -i LD_LIBRARY_PATH="${out}/usr/local/lib/kv-offload" ldd "${bin}" | grep 'not found' || true)"
    [[ -z "${missing}" ]] || { echo "unresolved: ${missing}" >&2; exit 1; }
    version="$(env -i LD_LIBRARY_PATH="${out}/usr/local/lib/kv-offload" "${bin}" version)"
    [[ -n "${version}" ]] || { echo "the staged webhook printed no version" >&2; exit 1; }
    echo "staged webhook runs: version ${version}"
    ;;
  agent)
    "${repo}/hack/stage-agent.sh" "${build}" "${out}"
    root="${out}/opt/kvoffload"
    # python/kvoffload/vllm.py is what --kv-transfer-config's spec_module_path imports.
    [[ -f "${root}/lib/libkvoffload.so" && -x "${root}/bin/kvoffload-install" \
       && -f "${root}/python/kvoffload/vllm.py" ]] \
      || { echo "staged agent layout incomplete" >&2; find "${out}" >&2; exit 1; }
    # The install entrypoint, as the init container runs it (but from the staged root).
    dest="$(mktemp -d)"
    sed "s#^src=/opt/kvoffload#src=${root}#" "${root}/bin/kvoffload-install" > "${out}/install.sh"
    sh "${out}/install.sh" "${dest}"
    [[ -f "${dest}/lib/libkvoffload.so" && -f "${dest}/python/kvoffload/vllm.py" ]] \
      || { echo "install did not copy the library and the Python package" >&2; exit 1; }
    cmp "${root}/lib/libkvoffload.so" "${dest}/lib/libkvoffload.so"
    # vLLM images do not carry ISA-L: the volume does, beside the library that loads it.
    isal="$(ldd "${dest}/lib/libkvoffload.so" | awk '/libisal/ {print $3}')"
    [[ "${isal}" == "${dest}/lib/"* ]] \
      || { echo "the installed library loads libisal from '${isal}', not from ${dest}/lib" >&2; exit 1; }
    rm -rf "${dest}"
    echo "staged agent installs into a volume"
    ;;
  *) echo "usage: check_dist.sh webhook|agent BUILD" >&2; exit 2 ;;
esac
