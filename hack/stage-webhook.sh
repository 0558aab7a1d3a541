#!/usr/bin/env bash
# stage-webhook.sh BUILD DEST: lays out the webhook image's payload under DEST as it sits in the
# image: usr/local/bin/kv-offload-webhook plus the shared libraries it links that a distroless
# runtime lacks in usr/local/lib/kv-offload (glibc itself comes from the runtime image).
set -euo pipefail
build="${1:?usage: stage-webhook.sh BUILD DEST}" dest="${2:?usage: stage-webhook.sh BUILD DEST}"
bin="${build}/webhook/kv-offload-webhook"
[[ -x "${bin}" ]] || { echo "stage-webhook: ${bin} not built (make build)" >&2; exit 1; }
rm -rf "${dest}"
mkdir -p "${dest}/usr/local/bin" "${dest}/usr/local/lib/kv-offload"
install -m 0755 "${bin}" "${dest}/usr/local/bin/kv-offload-webhook"
# Every resolved dependency except the glibc core, which must match the runtime's own.
ldd "${bin}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "${lib}")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) continue ;;
  esac
  cp -L "${lib}" "${dest}/usr/local/lib/kv-offload/"
done
if ldd "${bin}" | grep -q "not found"; then
  echo "stage-webhook: unresolved libraries:" >&2; ldd "${bin}" | grep "not found" >&2; exit 1
fi
echo "stage-webhook: staged $(find "${dest}" -type f | wc -l) files in ${dest}"
