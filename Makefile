# kv-offload: `make test` and `make demo` are the two entry points (see README.md).
BUILD        ?= build
BUILD_TYPE   ?= RelWithDebInfo
CMAKE_FLAGS  ?=
CTEST_FLAGS  ?=
JOBS         ?= $(shell nproc)
# ccache (installed by deps) in front of the compilers: a rebuild, another build type's tree of
# the same sources, or another clone at the same path compiles only what changed. Recursive
# (=), so it is looked up after deps installed it. CCACHE= turns it off, also in a tree
# configured with it (the launcher is set empty, not left as the cache has it).
CCACHE        = $(shell command -v ccache)
LAUNCHER      = -DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE)

.PHONY: all deps configure build test demo clean
all: build

deps:
	./hack/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DKVOFFLOAD_WERROR=ON $(LAUNCHER) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

demo: build
	./hack/demo.sh $(BUILD)

# Every tree the targets make: the build, the sanitizer, fuzz and CUDA builds, the staged image
# payloads and the GPU bundle (the caches outside the repository stay; see README.md).
clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(CUDA_BUILD) $(DIST) $(GPU_BUNDLE)

# Each part adds its own targets (e2e, bench, fuzz, images, ...) in mk/<part>.mk.
-include $(wildcard mk/*.mk)
