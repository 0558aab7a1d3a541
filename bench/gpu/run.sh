#!/usr/bin/env bash
# The prepared GPU check: runs the CUDA tests of libkvoffload on the lent GPU machine.
# That machine reaches no package registry, so the test comes built from the dev machine:
#   here:   make agent-gpu-bundle  (fills .cache/gpu-bundle: test binary, libcudart, liburing)
#   there:  run tool, carry [".cache/gpu-bundle"], command "bench/gpu/run.sh", timeout ~300 s
# Without the bundle, but with a CUDA toolkit and cmake there (CUDA_HOME), it builds the test.
# Results (gtest XML and log, nvidia-smi, transfer_core.json) go to $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
bundle=${GPU_BUNDLE:-.cache/gpu-bundle}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "run.sh: nvidia-smi failed (see $out/nvidia-smi.txt)" >&2

if [[ -x "$bundle/agent_cuda_device_test" ]]; then
  bin="$bundle/agent_cuda_device_test"
  kvo_lib="$PWD/$bundle/lib/libkvoffload.so"
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
  cmake --build build-cuda --target agent_cuda_device_test kvoffload
  bin=build-cuda/tests/offload-agent/agent_cuda_device_test
  kvo_lib="$PWD/build-cuda/offload-agent/libkvoffload.so"
fi

# Scratch block files on this machine's own disk.
KVOFFLOAD_TEST_SCRATCH=$(mktemp -d)
export KVOFFLOAD_TEST_SCRATCH
trap 'rm -rf "$KVOFFLOAD_TEST_SCRATCH"' EXIT
"$bin" --gtest_output="xml:$out/agent_cuda_device_test.xml" 2>&1 | tee "$out/agent_cuda_device_test.log"

# The vLLM adapter's transfer core (needs torch with CUDA on this machine; vLLM is not needed),
# against the CUDA-built libkvoffload.so of the bundle (make agent-gpu-bundle copies it).
if python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
  KVOFFLOAD_LIBRARY="$kvo_lib" PYTHONPATH="$PWD/offload-agent/python" \
    python3 bench/gpu/transfer_core.py "$KVOFFLOAD_TEST_SCRATCH" "$out/transfer_core.json"
else
  echo "run.sh: no torch with CUDA here; the transfer-core check did not run" >&2
  exit 3
fi
