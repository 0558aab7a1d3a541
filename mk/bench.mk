# Benchmarks: `make bench` builds, runs every benchmark with its limit measured in the
# same run (webhook vs nginx, disk tier vs fio, pinned tier vs memcpy, policy ns/op, hit ratio
# vs OPT, time to first token on vLLM's CPU engine with hits from each tier vs recompute),
# writes JSON into $(BENCH_RESULTS) and regenerates bench/RESULTS.md. Not part of `make test`.
# About 20 minutes on 2 cores (902 s on 2026-12-05; since 2026-12-06 the webhook's half-rate
# rows are measured on split cores too, about 5 minutes more: that section alone took 935 s;
# the TTFT section runs in the vLLM virtualenv of hack/vllm-venv.sh). BENCH_TRACE_FILES (colon-separated JSONL traces, such as
# Mooncake's) adds them to the hit-ratio section and to the command RESULTS.md records.
# Lengthen with BENCH_WRK_SECONDS, BENCH_WRK_ROUNDS, BENCH_RATE_SECONDS, BENCH_HALF_ROUNDS
# (webhook), BENCH_DISK_TOTAL, BENCH_DISK_REPS, BENCH_CPU_TOTAL, BENCH_POLICY_OPS,
# BENCH_POLICY_ROUNDS, BENCH_TRACE_REQUESTS (see bench/agent/run.py), BENCH_TTFT_TOKENS,
# BENCH_TTFT_ROUNDS, BENCH_TTFT_SERVE_TOKENS (bench/ttft/run.py). Where nvidia-smi sees a GPU, the GPU check (bench/gpu/run.sh, from the
# bundle of `make agent-gpu-bundle`) runs too and fills section 6; elsewhere that section is
# filled from a GPU run's files in $(BENCH_RESULTS), or kept as the last GPU run left it.
# (The GPU step calls `make`, not $(MAKE), so that `make -n bench` stays a dry run.)
BENCH_RESULTS ?= $(BUILD)/bench-results

.PHONY: bench bench-deps
bench-deps: deps
	./hack/install-deps.sh bench

bench: bench-deps build
	@mkdir -p $(BENCH_RESULTS)
	start=$$(date +%s) && \
	python3 bench/webhook/run.py $(BUILD) $(BENCH_RESULTS)/webhook.json && \
	python3 bench/agent/run.py $(BUILD) $(BENCH_RESULTS) && \
	"$$(./hack/vllm-venv.sh)/bin/python" bench/ttft/run.py $(BUILD) $(BENCH_RESULTS) && \
	if nvidia-smi -L > /dev/null 2>&1; then \
	  make agent-gpu-bundle && OUT=$(abspath $(BENCH_RESULTS)) bench/gpu/run.sh; \
	fi && \
	python3 bench/report.py $(BENCH_RESULTS) bench/RESULTS.md \
	  "$(if $(BENCH_TRACE_FILES),BENCH_TRACE_FILES=$(BENCH_TRACE_FILES) )make bench" \
	  $$(( $$(date +%s) - start ))
	@echo "bench: wrote bench/RESULTS.md (JSON in $(BENCH_RESULTS))"
