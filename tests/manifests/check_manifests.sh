#!/usr/bin/env bash
# Renders manifests/base and every overlay with kubectl kustomize (the pinned kubectl from the
# control plane cache, built when missing) and checks each rendering with check_rendered.py.
# The self-signed overlay is rendered from a scratch copy after certs/gen.sh fills it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if [[ -n "${KUBECTL:-}" ]]; then
  kubectl="${KUBECTL}"
else
  bin="$("${repo}/e2e/controlplane/build.sh" kubectl | tail -n1)"
  kubectl="${bin}/kubectl"
fi
[[ -x "${kubectl}" ]] || { echo "check_manifests: no kubectl at ${kubectl}" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
cp -r "${repo}/manifests" "${work}/manifests"
rm -rf "${work}/manifests/overlays/self-signed/generated"
"${repo}/certs/gen.sh" --out "${work}/manifests/overlays/self-signed/generated" >/dev/null

# A reused CA that expires before the serving certificate would is refused, naming it: the
# certificate was signed for --days anyway and the API server refused it from the CA's end on.
"${repo}/certs/gen.sh" --out "${work}/short-ca" --ca-days 10 >/dev/null 2>&1
if err="$("${repo}/certs/gen.sh" --out "${work}/short-ca" --days 30 2>&1 >/dev/null)"; then
  echo "check_manifests: gen.sh signed 30 days under a CA with 10 left" >&2
  exit 1
fi
[[ "${err}" == *"short-ca/ca.crt expires within the --days 30"* ]] \
  || { echo "check_manifests: gen.sh's refusal does not name the CA: ${err}" >&2; exit 1; }
"${repo}/certs/gen.sh" --out "${work}/short-ca" --days 5 >/dev/null 2>&1 \
  || { echo "check_manifests: gen.sh refused 5 days under a CA with 10 left" >&2; exit 1; }

failed=0
checked=0
for dir in "${work}/manifests/base" "${work}/manifests/overlays"/*/; do
  dir="${dir%/}"
  name="$(basename "${dir}")"
  if ! "${kubectl}" kustomize "${dir}" > "${work}/${name}.yaml"; then
    echo "${name}: FAIL kubectl kustomize ${dir#"${work}"/}" >&2
    failed=$((failed + 1))
    continue
  fi
  if ! python3 "${repo}/tests/manifests/check_rendered.py" "${name}" < "${work}/${name}.yaml"; then
    failed=$((failed + 1))
  fi
  checked=$((checked + 1))
done
((checked >= 3)) || { echo "check_manifests: expected base + 2 overlays, checked ${checked}" >&2; exit 1; }
exit $((failed > 0))
