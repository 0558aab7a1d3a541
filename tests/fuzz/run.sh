#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for SECONDS each, seeded from the golden files.
# Usage: tests/fuzz/run.sh <fuzz build dir> <seconds per target>
# Corpora grow in <build>/fuzz-corpus/<target>; crashes land in <build>/fuzz-artifacts/ and
# fail the run. One summary line per target (executions, crashes) goes to <build>/fuzz-summary.txt.
set -euo pipefail
build=$1
seconds=$2
src=$(cd "$(dirname "$0")" && pwd)
testdata=$src/../webhook/testdata
corpus=$build/fuzz-corpus
artifacts=$build/fuzz-artifacts
mkdir -p "$corpus" "$artifacts"

seed() {  # seed <target> <file...>: copies files in under their content hash (idempotent)
  local t=$1; shift
  mkdir -p "$corpus/$t"
  for f in "$@"; do cp "$f" "$corpus/$t/seed-$(sha1sum <"$f" | cut -c1-16)"; done
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# AdmissionReviews around every golden pod; spec annotations pulled out of them.
for pod in "$testdata"/*.pod.json; do
  n=$(basename "$pod" .pod.json)
  jq -c '{apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview",
          request: {uid: "seed", kind: {group: "", version: "v1", kind: "Pod"},
                    resource: {group: "", version: "v1", resource: "pods"},
                    namespace: "default", operation: "CREATE", object: .}}' "$pod" >"$tmp/$n.review"
  jq -r '.metadata.annotations["kvoffload.io/config"] // empty' "$pod" >"$tmp/$n.spec"
  [[ -s $tmp/$n.spec ]] || rm "$tmp/$n.spec"
done
seed fuzz_admission "$tmp"/*.review
seed fuzz_spec "$tmp"/*.spec
seed fuzz_quantity "$src"/seeds/quantity/*
seed fuzz_kubeconfig "$src"/seeds/kubeconfig/*
seed fuzz_yaml_inject "$src"/../../examples/*.yaml "$testdata"/*.pod.json
# The agent targets build their files from structure in the input: they start from nothing.
mkdir -p "$corpus/fuzz_block_file" "$corpus/fuzz_disk_recovery"

summary=$build/fuzz-summary.txt
: >"$summary"
# One target per core at a time (FUZZ_JOBS, default nproc): each target is single-threaded, and
# CI's budget is wall time. Every target still gets its full SECONDS.
parallel=${FUZZ_JOBS:-$(nproc)}
rm -f "$build"/fuzz-*.result
run_one() {  # run_one <target>: its result line goes to <build>/fuzz-<target>.result
  local t=$1 log=$build/fuzz-$1.log result execs
  # -timeout: an input taking 10 s is a hang, reported as a crash. -rss_limit_mb: a leak or an
  # unbounded allocation is one too. -max_len covers the largest golden AdmissionReview.
  if "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/$t-" \
       "$corpus/$t" >"$log" 2>&1; then
    result=ok
  else
    result=CRASH
  fi
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  echo "$t: ${seconds}s, ${execs:-0} executions, $result" >"$build/fuzz-$t.result"
}
targets=(fuzz_admission fuzz_quantity fuzz_spec fuzz_kubeconfig fuzz_yaml_inject
         fuzz_block_file fuzz_disk_recovery)
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  run_one "$t" &
done
wait
failed=0
for t in "${targets[@]}"; do
  tee -a "$summary" <"$build/fuzz-$t.result"
  if ! grep -q ', ok$' "$build/fuzz-$t.result"; then
    failed=1
    tail -n 60 "$build/fuzz-$t.log" >&2
  fi
done
exit "$failed"
