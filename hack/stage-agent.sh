#!/usr/bin/env bash
# stage-agent.sh BUILD DEST: lays out /opt/kvoffload of the offload-agent image under DEST:
#   lib/libkvoffload.so   the agent library (KVOFFLOAD_LIBRARY in injected pods)
#   python/               the Python package for vLLM (prepended to PYTHONPATH)
#   bin/kvoffload-install the install init container's entrypoint (copies lib/ and python/)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:?usage: stage-agent.sh BUILD DEST}" dest="${2:?usage: stage-agent.sh BUILD DEST}"
lib="$(find "${build}/offload-agent" -maxdepth 2 -name 'libkvoffload.so*' -type f 2>/dev/null | head -n1)"
[[ -n "${lib}" ]] || { echo "stage-agent: libkvoffload.so not built under ${build}/offload-agent (make build)" >&2; exit 1; }
rm -rf "${dest}"
mkdir -p "${dest}/opt/kvoffload/lib" "${dest}/opt/kvoffload/python" "${dest}/opt/kvoffload/bin"
cp -L "${lib}" "${dest}/opt/kvoffload/lib/libkvoffload.so"
# ISA-L and liburing go beside it (libkvoffload's RUNPATH is $ORIGIN): the library is loaded in
# the vLLM container, whose image carries neither, not in the agent image. Both need only libc.
for name in libisal liburing; do
  dep="$(ldd "${lib}" | awk -v n="${name}.so" 'index($1, n) == 1 {print $3}')"
  [[ -f "${dep}" ]] || { echo "stage-agent: ${lib} does not link ${name} (hack/install-deps.sh, then make build)" >&2; exit 1; }
  cp -L "${dep}" "${dest}/opt/kvoffload/lib/"
done
if [[ -d "${repo}/offload-agent/python" ]]; then
  cp -R "${repo}/offload-agent/python/." "${dest}/opt/kvoffload/python/"
  find "${dest}/opt/kvoffload/python" -name __pycache__ -prune -exec rm -rf {} +
else
  echo "stage-agent: offload-agent/python not present yet; python/ is empty" >&2
fi
install -m 0755 "${repo}/offload-agent/kvoffload-install" "${dest}/opt/kvoffload/bin/kvoffload-install"
echo "stage-agent: staged $(find "${dest}" -type f | wc -l) files in ${dest}/opt/kvoffload"
