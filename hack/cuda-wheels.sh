#!/usr/bin/env bash
# Installs the CUDA 13.0.x runtime headers and libcudart from NVIDIA's PyPI wheels into a cache
# directory outside the repo (KVOFFLOAD_CUDA_CACHE; default cuda-13.0 under KVOFFLOAD_CACHE,
# /var/cache/kv-offload, else ~/.cache/kv-offload), so the agent's CUDA backend compiles on
# machines without a CUDA toolkit (CI). Prints the toolkit root (the directory holding include/
# and lib/) on stdout.
# 13.0.x matches the driver of the GPU machine; a newer runtime would not load there.
# Idempotent: does nothing but print the path when the headers are already there.
set -euo pipefail

CACHE_ROOT=${KVOFFLOAD_CACHE:-/var/cache/kv-offload}
if ! mkdir -p "$CACHE_ROOT" 2>/dev/null || [[ ! -w "$CACHE_ROOT" ]]; then CACHE_ROOT="$HOME/.cache/kv-offload"; fi
CACHE_DIR=${KVOFFLOAD_CUDA_CACHE:-$CACHE_ROOT/cuda-13.0}
RUNTIME_VERSION=13.0.96
CRT_VERSION=13.0.88
root="$CACHE_DIR/nvidia/cu13"

mkdir -p "$CACHE_DIR"
# Two cold runs installed into one directory at once: one at a time, as the other caches are.
exec 9>"$CACHE_DIR/.lock"
flock 9
if [[ ! -f "$root/include/cuda_runtime.h" || ! -f "$root/include/crt/host_config.h" \
      || ! -f "$root/lib/libcudart.so.13" ]]; then
  python3 -m pip install --quiet --no-deps --upgrade --target "$CACHE_DIR" \
    "nvidia-cuda-runtime==$RUNTIME_VERSION" "nvidia-cuda-crt==$CRT_VERSION" >&2
fi
# The wheel ships only the versioned soname; the linker wants the plain name.
ln -sf libcudart.so.13 "$root/lib/libcudart.so"
echo "$root"
