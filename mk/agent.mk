# offload-agent make targets (included by the top-level Makefile).
#
# agent-cuda-build: compiles the CUDA device backend, its GPU test and the GPU benchmark
#   (kvoffload-bench gpu) against NVIDIA's CUDA 13.0 runtime wheels (hack/cuda-wheels.sh), in a
#   separate build tree, without running anything: CI machines have no GPU. `make test` depends
#   on it so that CI proves they compile.
# agent-gpu-bundle: the GPU test and benchmark binaries with libkvoffload (also what the Python
#   transfer-core check loads), libcudart, liburing and libisal in .cache/gpu-bundle (about 4 MiB, stripped), for
#   a GPU node without a compiler or package access: copy it there with the checkout and run
#   bench/gpu/run.sh.
# check-aarch64: the block checksum tests built for aarch64 and run under qemu-user, with a check
#   that ISA-L takes its CRC32C-instruction kernel there (hack/check-aarch64.sh; installs the
#   cross compiler, qemu-user and arm64 libraries, so it is not part of `make test`; CI runs it).
CUDA_BUILD ?= build-cuda
GPU_BUNDLE ?= .cache/gpu-bundle

.PHONY: agent-cuda-build agent-gpu-bundle check-aarch64
check-aarch64:
	./hack/check-aarch64.sh

agent-cuda-build: deps
	root=$$(./hack/cuda-wheels.sh) && \
	cmake -S . -B $(CUDA_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DKVOFFLOAD_WERROR=ON \
	  -DKVOFFLOAD_WITH_CUDA=ON -DCUDAToolkit_ROOT=$$root $(CMAKE_FLAGS)
	cmake --build $(CUDA_BUILD) -j $(JOBS) --target kvoffload agent_cuda_device_test kvoffload-bench

agent-gpu-bundle: agent-cuda-build
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)/lib
	cp $(CUDA_BUILD)/tests/offload-agent/agent_cuda_device_test $(CUDA_BUILD)/bench/kvoffload-bench \
	  $(GPU_BUNDLE)/
	cp -L $(CUDA_BUILD)/offload-agent/libkvoffload.so.0 $(GPU_BUNDLE)/lib/
	cp -L "$$(./hack/cuda-wheels.sh)/lib/libcudart.so.13" $(GPU_BUNDLE)/lib/
	ldd $(GPU_BUNDLE)/agent_cuda_device_test | awk '/liburing|libisal/ {print $$3}' | xargs -r -I{} cp -L {} $(GPU_BUNDLE)/lib/
	# Debug info is most of the binaries' size, and a device machine takes 64 MiB at most.
	strip --strip-debug $(GPU_BUNDLE)/agent_cuda_device_test $(GPU_BUNDLE)/kvoffload-bench \
	  $(GPU_BUNDLE)/lib/libkvoffload.so.0

test: agent-cuda-build
