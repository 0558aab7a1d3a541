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
    # The library is loaded in the vLLM container, from an image we do not build. It may need
    # glibc and the C++ runtime, which every vLLM image has (torch needs them); anything else
    # comes from the volume, beside it. (The sanitizer trees' runtimes are allowed: those
    # builds are checked here too but never shipped.)
    for so in $(readelf -d "${dest}/lib/libkvoffload.so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
      case "${so}" in
        libc.so.6 | libm.so.6 | ld-linux-*.so.2 | libstdc++.so.6 | libgcc_s.so.1 | libcudart.so.*) ;;
        libasan.so.* | libtsan.so.* | libubsan.so.*) ;;
        *)
          where="$(ldd "${dest}/lib/libkvoffload.so" | awk -v n="${so}" '$1 == n {print $3}')"
          [[ "${where}" == "${dest}/lib/${so}" ]] \
            || { echo "the installed library loads ${so} from '${where}', not from ${dest}/lib" >&2; exit 1; } ;;
      esac
    done
    # And the oldest of those runtimes it must load with: glibc 2.34 and GCC 11's libstdc++
    # (GLIBCXX_3.4.29), as in Red Hat's UBI 9, the base of vLLM's Dockerfile.ubi images;
    # Ubuntu 22.04 (vLLM's own images) and Debian 12 have newer ones.
    for lib in "${dest}"/lib/*.so*; do
      for floor in GLIBC:2.34 GLIBCXX:3.4.29; do
        v="$({ objdump -T "${lib}" | grep -o "${floor%%:*}_[0-9][0-9.]*" || true; } \
             | sed "s/^${floor%%:*}_//" | sort -uV | tail -n1)"
        [[ -z "${v}" || "$(printf '%s\n%s\n' "${v}" "${floor#*:}" | sort -V | tail -n1)" == "${floor#*:}" ]] \
          || { echo "$(basename "${lib}") needs ${floor%%:*}_${v}, newer than ${floor#*:}" >&2; exit 1; }
      done
    done
    rm -rf "${dest}"
    echo "staged agent installs into a volume"
    ;;
  *) echo "usage: check_dist.sh webhook|agent BUILD" >&2; exit 2 ;;
esac
