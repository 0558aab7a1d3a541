#!/usr/bin/env bash
# The prepared GPU check: runs the CUDA tests of libkvoffload on the lent GPU machine.
# That machine reaches no package registry, so everything comes from this machine:
#   here:   make agent-gpu-bundle        (builds build-cuda/ against .cache/cuda-13.0/)
#   there:  run tool, carry ["build-cuda", ".cache/cuda-13.0"], command "bench/gpu/run.sh"
# With a CUDA toolkit and cmake there instead (CUDA_HOME set), it builds build-cuda itself.
# Results (gtest XML, nvidia-smi) go to $OUT when set. The benchmark part comes later.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
build=${CUDA_BUILD:-build-cuda}
bin="$build/tests/offload-agent/agent_cuda_device_test"

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "run.sh: nvidia-smi failed (see $out/nvidia-smi.txt)" >&2

cudart_dir=""
for d in "$PWD/.cache/cuda-13.0/nvidia/cu13/lib" "/var/cache/kv-offload/cuda-13.0/nvidia/cu13/lib" \
         "${CUDA_HOME:-/usr/local/cuda}/lib64"; do
  if [[ -e "$d/libcudart.so.13" ]]; then cudart_dir=$d; break; fi
done

if [[ ! -x "$bin" ]]; then
  root=${CUDA_HOME:-/usr/local/cuda}
  if [[ ! -f "$root/include/cuda_runtime.h" ]] || ! command -v cmake > /dev/null; then
    echo "run.sh: no prebuilt $bin and no CUDA toolkit + cmake here; run 'make agent-gpu-bundle'" \
         "on the dev machine and carry build-cuda and .cache/cuda-13.0" >&2
    exit 2
  fi
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVOFFLOAD_WITH_CUDA=ON \
    -DKVOFFLOAD_WITH_LIBURING=OFF -DCUDAToolkit_ROOT="$root"
  cmake --build "$build" --target agent_cuda_device_test
fi

export LD_LIBRARY_PATH="${cudart_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Scratch block files on this machine's own disk.
KVOFFLOAD_TEST_SCRATCH=$(mktemp -d)
export KVOFFLOAD_TEST_SCRATCH
trap 'rm -rf "$KVOFFLOAD_TEST_SCRATCH"' EXIT
"$bin" --gtest_output="xml:$out/agent_cuda_device_test.xml" 2>&1 | tee "$out/agent_cuda_device_test.log"
