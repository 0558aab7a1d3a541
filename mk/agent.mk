# offload-agent make targets (included by the top-level Makefile).
#
# agent-cuda-build: compiles the CUDA device backend and its GPU test against NVIDIA's CUDA 13.0
#   runtime wheels (hack/cuda-wheels.sh), in a separate build tree, without running anything:
#   CI machines have no GPU. `make test` depends on it so that CI proves the backend compiles.
#   liburing is left out of that tree so the GPU test binary runs on a bare GPU machine.
# agent-gpu-bundle: the same, plus a copy of the CUDA runtime inside the tree, so that the GPU
#   machine (which reaches no package registry) gets everything through the run tool's carry:
#   carry [build-cuda, .cache/cuda-13.0], command bench/gpu/run.sh.
CUDA_BUILD ?= build-cuda
KVOFFLOAD_CUDA_CACHE ?= /var/cache/kv-offload/cuda-13.0

.PHONY: agent-cuda-build agent-gpu-bundle
agent-cuda-build: deps
	root=$$(KVOFFLOAD_CUDA_CACHE=$(KVOFFLOAD_CUDA_CACHE) ./hack/cuda-wheels.sh) && \
	cmake -S . -B $(CUDA_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DKVOFFLOAD_WERROR=ON \
	  -DKVOFFLOAD_WITH_CUDA=ON -DKVOFFLOAD_WITH_LIBURING=OFF -DCUDAToolkit_ROOT=$$root $(CMAKE_FLAGS)
	cmake --build $(CUDA_BUILD) -j $(JOBS) --target kvoffload agent_cuda_device_test

agent-gpu-bundle: KVOFFLOAD_CUDA_CACHE = $(CURDIR)/.cache/cuda-13.0
agent-gpu-bundle: agent-cuda-build

test: agent-cuda-build
