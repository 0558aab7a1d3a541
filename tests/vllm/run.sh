#!/usr/bin/env bash
# ctest entry of the vLLM adapter tests: builds (once, cached by version outside the repo) the
# pinned vLLM virtualenv with hack/vllm-venv.sh, then runs pytest on the given test files (all
# of tests/vllm when none is given) against the given libkvoffload.so. Fails when the venv
# cannot be built or when pytest collects no test.
# With KVOFFLOAD_VLLM_PYTHON=VERSION, `import vllm` is that release's Python sources over the
# venv (hack/vllm-python.sh): for releases without a CPU build, whose scheduler and connector
# run here but whose engine cannot.
#   [KVOFFLOAD_VLLM_PYTHON=0.34.0] run.sh /path/to/libkvoffload.so [tests/vllm/test_x.py ...]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
lib="${1:?usage: run.sh LIBKVOFFLOAD_SO [TEST_FILE ...]}"
shift
((${#} > 0)) || set -- "${repo}/tests/vllm"
venv="$("${repo}/hack/vllm-venv.sh")"
export KVOFFLOAD_LIBRARY="${lib}"
export PYTHONPATH="${repo}/offload-agent/python:${repo}/tests/vllm"
if [[ -n "${KVOFFLOAD_VLLM_PYTHON:-}" ]]; then
  PYTHONPATH="$("${repo}/hack/vllm-python.sh" "${KVOFFLOAD_VLLM_PYTHON}"):${PYTHONPATH}"
fi
# No bytecode in the source tree (stage-agent.sh copies offload-agent/python as is).
export PYTHONDONTWRITEBYTECODE=1
# vLLM's engines bind their ZMQ sockets as files under this (default /tmp), and leave them:
# each run left about fifty there.
rpc="$(mktemp -d /tmp/kvoffload-vllm-rpc.XXXXXX)"
trap 'rm -rf "${rpc}"' EXIT
export VLLM_RPC_BASE_PATH="${rpc}"
set +e
"${venv}/bin/python" -m pytest -p no:cacheprovider -q "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
[[ ${rc} -ne 5 ]] || { echo "run.sh: pytest collected no test" >&2; exit 1; }
exit "${rc}"
