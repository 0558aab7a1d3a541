#!/usr/bin/env bash
# The GPU check for a machine with an NVIDIA GPU, in one command, under 5 minutes:
#   1. the CUDA tests of libkvoffload (gtest XML and log);
#   2. the GPU bandwidth benchmark: D2H/H2D for 16 KiB..8 MiB blocks through the agent's cuda
#      device, one copy call per block against batched calls, each against the ceiling (one
#      cudaMemcpy of a large pinned buffer), into $OUT/gpu-bench.json.
# A GPU node often has no compiler and no package access; build there or bring a bundle:
#   on a build machine:  make agent-gpu-bundle  (fills .cache/gpu-bundle: test and bench
#                        binaries, libkvoffload, libcudart, liburing, libisal; about 4 MiB)
#   on the GPU node:     copy the checkout with .cache/gpu-bundle, run OUT=<dir> bench/gpu/run.sh
#   afterwards:          copy <dir>/gpu-bench.json into build/bench-results and run
#                        python3 bench/report.py build/bench-results bench/RESULTS.md "make bench" <s>
# Without the bundle, but with a CUDA toolkit and cmake on the node (CUDA_HOME), it builds both.
#   3. the vLLM adapter's transfer core with CUDA tensors through pinned host and disk
#      (needs torch with CUDA there; vLLM is not needed), into $OUT/transfer_core.json, and its
#      tests (tests/vllm/test_transfer_core.py) with CUDA tensors where pytest is there.
# Results (gtest XML and log, nvidia-smi, compute-sanitizer's log, gpu-bench.json and its log,
# transfer_core.json, the transfer core tests' XML: 8 files) go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
bundle=${GPU_BUNDLE:-.cache/gpu-bundle}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "run.sh: nvidia-smi failed (see $out/nvidia-smi.txt)" >&2

if [[ -x "$bundle/agent_cuda_device_test" && -x "$bundle/kvoffload-bench" ]]; then
  bin="$bundle/agent_cuda_device_test"
  bench="$bundle/kvoffload-bench"
  kvo_lib="$PWD/$bundle/lib/libkvoffload.so.0"
  export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  root=${CUDA_HOME:-/usr/local/cuda}
  if [[ ! -f "$root/include/cuda_runtime.h" ]] || ! command -v cmake > /dev/null; then
    echo "run.sh: no $bundle and no CUDA toolkit + cmake here;" \
         "run 'make agent-gpu-bundle' on a build machine and copy $bundle here" >&2
    exit 2
  fi
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVOFFLOAD_WITH_CUDA=ON \
    -DCUDAToolkit_ROOT="$root"
  cmake --build build-cuda --target agent_cuda_device_test kvoffload-bench kvoffload
  bin=build-cuda/tests/offload-agent/agent_cuda_device_test
  bench=build-cuda/bench/kvoffload-bench
  kvo_lib="$PWD/build-cuda/offload-agent/libkvoffload.so"
fi

# Scratch block files on this machine's own disk.
KVOFFLOAD_TEST_SCRATCH=$(mktemp -d)
export KVOFFLOAD_TEST_SCRATCH
trap 'rm -rf "$KVOFFLOAD_TEST_SCRATCH"' EXIT
# A failing test is reported but does not cost the bandwidth figures: both are wanted from the
# one run on the GPU node. The exit code is the tests'.
rc=0
"$bin" --gtest_output="xml:$out/agent_cuda_device_test.xml" 2>&1 | tee "$out/agent_cuda_device_test.log" || rc=$?
# The same tests under compute-sanitizer's memcheck (CUDA API errors, device memory leaks), where
# the node has it; its report is part of the results, and an error it finds fails the run.
sanitizer=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2> /dev/null || true)
if [[ -n "$sanitizer" ]]; then
  "$sanitizer" --tool memcheck --leak-check full --error-exitcode 9 "$bin" > "$out/compute-sanitizer.log" 2>&1 ||
    { echo "run.sh: compute-sanitizer memcheck failed (see $out/compute-sanitizer.log)" >&2; [[ $rc -ne 0 ]] || rc=5; }
  tail -3 "$out/compute-sanitizer.log"
else
  echo "run.sh: no compute-sanitizer here; the memcheck run did not happen" >&2
fi
# 1 GiB buffers, 3 repetitions per shape, at most 16384 copies per shape: about a minute.
if timeout 180 "$bench" gpu --total=1G --reps=3 > "$out/gpu-bench.json" 2> >(tee "$out/gpu-bench.log" >&2); then
  cat "$out/gpu-bench.json"
else
  echo "run.sh: kvoffload-bench gpu failed (see $out/gpu-bench.log)" >&2
  [[ $rc -ne 0 ]] || rc=4
fi
if python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
  KVOFFLOAD_LIBRARY="$kvo_lib" PYTHONPATH="$PWD/offload-agent/python" \
    python3 bench/gpu/transfer_core.py "$KVOFFLOAD_TEST_SCRATCH" "$out/transfer_core.json" || rc=$?
  # The transfer core's own tests (tests/vllm/test_transfer_core.py) with CUDA tensors.
  if python3 -c 'import pytest' 2> /dev/null; then
    KVOFFLOAD_TEST_DEVICE=cuda KVOFFLOAD_LIBRARY="$kvo_lib" PYTHONDONTWRITEBYTECODE=1 \
      PYTHONPATH="$PWD/offload-agent/python:$PWD/tests/vllm" python3 -m pytest -p no:cacheprovider \
      -q --junitxml="$out/transfer_core_tests.xml" tests/vllm/test_transfer_core.py || rc=$?
  else
    echo "run.sh: no pytest here; the transfer core's tests did not run on CUDA" >&2
  fi
else
  echo "run.sh: no torch with CUDA here; the transfer-core check did not run" >&2
  [[ $rc -ne 0 ]] || rc=3
fi
exit "$rc"
