#!/usr/bin/env bash
# Issue 28 item 3 on one H200: the 8B space's BF16 reference under candidate probe regimes
# (scripts/gpu_regime.py: verdict, signals, seed spread, step time per regime), in under 6 minutes.
# The table and the stderr progress go to $OUT/regime.log, the report to $OUT/regime.json (written after
# every regime, so a run stopped by the timeout keeps what it measured):
#   run(command="bash scripts/gpu_regime.sh", carry=[".gpu"], timeout_s=420)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_regime_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader
timeout -k 10 "${REGIME_TIMEOUT:-350}" python3 scripts/gpu_regime.py "${SPACE:-search_spaces/llama3_8b_h100.yaml}" \
    --seeds "${SEEDS:-3}" --budget-s "${BUDGET:-290}" ${REGIMES:-} > "$OUT/regime.log" 2>&1
echo "gpu_regime exit $?" >> "$OUT/regime.log"
grep -v "^  lr .*: seed" "$OUT/regime.log"
