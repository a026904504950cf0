#!/usr/bin/env bash
# Issue 29 on one H200: the 16-trial 8B study BEFORE (PRECSEARCH_SYNC_RECORD=1, records inline) and AFTER
# (the recorder thread), back to back in one scripts/bench_probe.py call; the before/after table in the log,
# both breakdowns and trials per GPU-hour in the JSON. Two studies of ~3 min each: about 7 min in all.
#   run(command="bash scripts/gpu_throughput.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_throughput_out
source "$(dirname "$0")/gpu_env.sh"
TRIALS="${TRIALS:-16}"
timeout "${STUDY_TIMEOUT:-570}" python3 scripts/bench_probe.py search_spaces/llama3_8b_h100.yaml --trials "$TRIALS" \
    --compare --workdir /tmp/bench_probe_compare --json "$OUT/bench_probe_compare.json" > "$OUT/bench_probe_compare.log" 2>&1
echo "bench_probe exit $?" >> "$OUT/bench_probe_compare.log"
tail -20 "$OUT/bench_probe_compare.log"
