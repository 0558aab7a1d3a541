#!/usr/bin/env bash
# The long reliability trials, against a built tree; figures go to RESULTS.md by hand.
#   tests/reliability/run.sh <build dir>
# 1. webhook: 100k admissions at concurrency 64 with the serving cert rotated every 10 s, then
#    SIGTERM under load (webhook_load.py; prints JSON, exits 1 on a failed criterion).
# 2. webhook: admissions on fresh connections while 1000 hostile connections of each kind are
#    held open (silent TCP, idle TLS, headers or a body a byte a second, mixed), and RSS with
#    10000 idle connections (webhook_hostile.py; prints JSON, exits 1 on a failed criterion).
# 3. webhook: Go's HTTP client (as in the API server) sending admissions on keep-alive
#    connections spaced around the idle deadlines: none fails when the client's idle timeout is
#    the shorter one, and the control (the webhook's shorter) shows the race it avoids
#    (webhook_keepalive.py; prints JSON, exits 1 on a failed criterion).
# 4. agent: 100 SIGKILL trials with restart and content check, and a 60 s two-process hammer
#    on one shared tier (the crash test at full size; prints its figures).
set -euo pipefail
if [[ $# -ne 1 || ! -x "$1/webhook/kv-offload-webhook" ]]; then
  echo "usage: tests/reliability/run.sh BUILD_DIR (a built tree, e.g. build after make build)" >&2
  exit 1
fi
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
"$here/webhook_load.py" "$build/webhook/kv-offload-webhook" \
  --requests "${LOAD_REQUESTS:-100000}" --concurrency "${LOAD_CONCURRENCY:-64}" --rotate 10
"$here/webhook_hostile.py" "$build/webhook/kv-offload-webhook" --hostile "${HOSTILE_CONNECTIONS:-1000}"
"$here/webhook_keepalive.py" "$build/webhook/kv-offload-webhook" --requests "${KEEPALIVE_REQUESTS:-1000}"
KVO_CRASH_TRIALS=${KVO_CRASH_TRIALS:-100} KVO_HAMMER_SECONDS=${KVO_HAMMER_SECONDS:-60} \
  "$build/tests/offload-agent/agent_crash_test" --gtest_brief=0
