# Reliability: sanitizers, fuzzing, long load/crash trials.
#   make test-asan    every test that runs our C++ under ASan+UBSan, in $(ASAN_BUILD)
#   make test-tsan    those of them that start threads under TSan, in $(TSAN_BUILD)
#                     (tests/CMakeLists.txt: SINGLE_THREADED; the vLLM tests run in neither)
#   make fuzz         every libFuzzer target for FUZZ_SECONDS each (default 600), clang from Debian
#   make fuzz-ci      the same for 60 s each (what .ci/run runs)
#   make reliability  long trials (webhook load with faults, agent crash trials); not in `make test`
# `make test` stays the fast developer loop; .ci/run runs test, test-asan, test-tsan and fuzz-ci
# (all of them together are the issue's "make test with sanitizers and short fuzz runs").
ASAN_BUILD   ?= build-asan
TSAN_BUILD   ?= build-tsan
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 600
SAN_JOBS     ?= $(JOBS)
# Sanitized builds skip the bench tools and the CUDA tree: they test behaviour, not speed.
# -O1 -g1: the ASan and TSan documentation ask for -O1 or more, libFuzzer's builds with -O1, and
# line tables (-g1) are enough for a report's stack to name files and lines. Compiling is most
# of these targets' time: `make test-asan` took 13 minutes on 2 cores with -O2 -g and 8 with
# -O1 -g1 (one webhook test file: 119 s against 47 s).
SAN_OPT      = -O1 -g1 -DNDEBUG
SAN_FLAGS    = -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVOFFLOAD_WERROR=ON -DKVOFFLOAD_WITH_CUDA=OFF \
               -DCMAKE_C_FLAGS_RELWITHDEBINFO="$(SAN_OPT)" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SAN_OPT)" \
               $(LAUNCHER)

.PHONY: test-asan test-tsan fuzz fuzz-ci fuzz-build reliability
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(SAN_FLAGS) -DKVOFFLOAD_SANITIZE=asan $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(SAN_JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) $(SAN_FLAGS) -DKVOFFLOAD_SANITIZE=tsan $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(SAN_JOBS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(abspath tests/tsan.supp) \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

# libFuzzer needs clang; Debian's clang-14 + libclang-rt-14-dev (hack/install-deps.sh).
fuzz-build: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$(SAN_OPT)" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SAN_OPT)" \
	  -DKVOFFLOAD_SANITIZE=fuzz -DKVOFFLOAD_BUILD_TESTS=OFF -DKVOFFLOAD_WITH_CUDA=OFF \
	  $(LAUNCHER) $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(SAN_JOBS) --target fuzz_targets

fuzz: fuzz-build
	./tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

fuzz-ci: fuzz-build
	./tests/fuzz/run.sh $(FUZZ_BUILD) 60

reliability: build
	./tests/reliability/run.sh $(BUILD)
