# Benchmarks: `make bench` builds, runs every benchmark with its limit measured in the
# same run (webhook vs nginx, disk tier vs fio, pinned tier vs memcpy, policy ns/op, hit ratio
# vs OPT), writes JSON into $(BENCH_RESULTS) and regenerates bench/RESULTS.md. Not part of
# `make test`. About 10 minutes on 2 cores; lengthen with BENCH_WRK_SECONDS,
# BENCH_RATE_SECONDS (webhook), BENCH_DISK_TOTAL, BENCH_DISK_REPS, BENCH_CPU_TOTAL,
# BENCH_POLICY_OPS, BENCH_TRACE_REQUESTS (see bench/agent/run.py). The GPU table is filled from
# $(BENCH_RESULTS)/gpu-bench.json when a GPU run left one there (bench/gpu/run.sh).
BENCH_RESULTS ?= $(BUILD)/bench-results

.PHONY: bench bench-deps
bench-deps: deps
	./hack/install-deps.sh bench

bench: bench-deps build
	@mkdir -p $(BENCH_RESULTS)
	start=$$(date +%s) && \
	python3 bench/webhook/run.py $(BUILD) $(BENCH_RESULTS)/webhook.json && \
	python3 bench/agent/run.py $(BUILD) $(BENCH_RESULTS) && \
	python3 bench/report.py $(BENCH_RESULTS) bench/RESULTS.md "make bench" $$(( $$(date +%s) - start ))
	@echo "bench: wrote bench/RESULTS.md (JSON in $(BENCH_RESULTS))"
