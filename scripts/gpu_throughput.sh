#!/usr/bin/env bash
# Issue 29 on one H200: the 16-trial 8B study BEFORE (PRECSEARCH_SYNC_RECORD=1, records inline) and AFTER
# (the recorder thread), back to back in one scripts/bench_probe.py call; the before/after table in the log,
# both breakdowns and trials per GPU-hour in the JSON. Two studies of ~3 min each: about 7 min in all.
#   run(command="bash scripts/gpu_throughput.sh", carry=[".gpu"], timeout_s=600)
# ONLY=before / ONLY=after runs one of the two (when both do not fit one call): each writes
# $OUT/bench_probe_<variant>.json (NAME= renames it; SPACE= another space file), and `python scripts/bench_probe.py --merge B.json A.json` compares them here.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_throughput_out
source "$(dirname "$0")/gpu_env.sh"
TRIALS="${TRIALS:-16}"
NAME="${NAME:-${ONLY:-compare}}"
if [ -n "${ONLY:-}" ]; then MODE=(--only "$ONLY"); else MODE=(--compare); fi
timeout "${STUDY_TIMEOUT:-570}" python3 scripts/bench_probe.py "${SPACE:-search_spaces/llama3_8b_h100.yaml}" --trials "$TRIALS" \
    "${MODE[@]}" --workdir /tmp/bench_probe_compare --json "$OUT/bench_probe_$NAME.json" \
    > "$OUT/bench_probe_$NAME.log" 2>&1
echo "bench_probe exit $?" >> "$OUT/bench_probe_$NAME.log"
tail -20 "$OUT/bench_probe_$NAME.log"
