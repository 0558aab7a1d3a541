#!/usr/bin/env bash
# The prepared GPU check: runs the CUDA tests of libkvoffload on the lent GPU machine.
# That machine reaches no package registry, so the test comes built from the dev machine:
#   here:   make agent-gpu-bundle  (fills .cache/gpu-bundle: test binary, libcudart, liburing)
#   there:  run tool, carry [".cache/gpu-bundle"], command "bench/gpu/run.sh", timeout ~300 s
# Without the bundle, but with a CUDA toolkit and cmake there (CUDA_HOME), it builds the test.
# Results (gtest XML and log, nvidia-smi) go to $OUT when set. The benchmark part comes later.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
bundle=${GPU_BUNDLE:-.cache/gpu-bundle}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "run.sh: nvidia-smi failed (see $out/nvidia-smi.txt)" >&2

if [[ -x "$bundle/agent_cuda_device_test" ]]; then
  bin="$bundle/agent_cuda_device_test"
  export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  root=${CUDA_HOME:-/usr/local/cuda}
  if [[ ! -f "$root/include/cuda_runtime.h" ]] || ! command -v cmake > /dev/null; then
    echo "run.sh: no $bundle and no CUDA toolkit + cmake here;" \
         "run 'make agent-gpu-bundle' on the dev machine and carry $bundle" >&2
    exit 2
  fi
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVOFFLOAD_WITH_CUDA=ON \
    -DCUDAToolkit_ROOT="$root"
  cmake --build build-cuda --target agent_cuda_device_test
  bin=build-cuda/tests/offload-agent/agent_cuda_device_test
fi

# Scratch block files on this machine's own disk.
KVOFFLOAD_TEST_SCRATCH=$(mktemp -d)
export KVOFFLOAD_TEST_SCRATCH
trap 'rm -rf "$KVOFFLOAD_TEST_SCRATCH"' EXIT
"$bin" --gtest_output="xml:$out/agent_cuda_device_test.xml" 2>&1 | tee "$out/agent_cuda_device_test.log"
