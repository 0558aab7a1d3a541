#!/usr/bin/env bash
# The PrometheusRule's alerts under the real promtool: Debian's prometheus package, unpacked by
# hack/debian-rootfs.sh (no service is installed or started). `promtool check rules --lint=all`
# on its groups, then `promtool test rules` on prometheusrule_test.yaml, where each alert must
# fire where its description says and stay quiet otherwise: check_monitoring.py's parser
# reads the expressions, but only Prometheus evaluates them (a 5m rate with `for: 5m` never
# fired on one error, a threshold inside a bucket fired on admissions far below it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
root="$("${repo}/hack/debian-rootfs.sh" prometheus | tail -1)"
promtool="${root}/tree/usr/bin/promtool"
[[ -x "${promtool}" ]] || { echo "check_alerts: no promtool in ${root}" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
# promtool reads plain rule files: the PrometheusRule's spec.groups under `groups:`.
python3 - "${repo}/manifests/monitoring/prometheusrule.yaml" "${tmp}/rules.yaml" <<'PY'
import sys
import yaml
rule = yaml.safe_load(open(sys.argv[1]))
yaml.safe_dump({"groups": rule["spec"]["groups"]}, open(sys.argv[2], "w"))
PY
cp "${here}/prometheusrule_test.yaml" "${tmp}/"
cd "${tmp}"
"${promtool}" --version | head -1
"${promtool}" check rules --lint=all rules.yaml
"${promtool}" test rules prometheusrule_test.yaml
