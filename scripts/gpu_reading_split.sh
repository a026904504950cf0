#!/usr/bin/env bash
# Issue 29: where a trial's fixed-state reading spends its time in a real study of the shipped 8B space (the
# run's trace splits it: BF16 side, per state the policy's side and the compare). A few trials; the trace is
# written straight into $OUT, so a call cut short still brings back every finished span.
#   run(command="bash scripts/gpu_reading_split.sh", carry=[".gpu"], timeout_s=...)
# Ran on an H100 on 2026-12-05: scripts/results/2026-12-05_h100_reading_split.log, docs/throughput.md.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_reading_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
export PRECSEARCH_TRACE="$OUT/trace.jsonl"
timeout "${TIMEOUT:-150}" python3 -m precsearch run "${SPACE:-search_spaces/llama3_8b_h100.yaml}" \
    --n-trials "${TRIALS:-4}" --output-dir /tmp/reading_split --no-progress > "$OUT/run.log" 2>&1
echo "precsearch run exit $?" | tee -a "$OUT/run.log"
tail -25 "$OUT/run.log"
python3 -m precsearch.runtime.timeline "$OUT/trace.jsonl" | tee "$OUT/timeline.txt"
