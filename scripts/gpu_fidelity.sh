#!/usr/bin/env bash
# Issue 14's judge on one H200: scripts/bench_fidelity.py with rungs, two seeds and the risk score.
# The full comparison (17 policies x 2 seeds x 2000 steps, plus references) does not fit one call: split it
# with ONLY (policy-name fragments) over several calls with the same settings, each writing its part, e.g.
#   run(command="ONLY='control fp8_delayed,' bash scripts/gpu_fidelity.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_fidelity_out
source "$(dirname "$0")/gpu_env.sh"
timeout "${FID_TIMEOUT:-560}" python3 scripts/bench_fidelity.py --rungs ${RUNGS:-50 200 2000} --seeds "${SEEDS:-2}" \
    --layers "${LAYERS:-4}" --dim "${DIM:-512}" --seq-len "${SEQ:-512}" --micro-batch "${MB:-8}" \
    ${ONLY:+--only $ONLY} --partial "$OUT/fidelity_partial.json" --out "$OUT" > "$OUT/fidelity.log" 2>&1
echo "bench_fidelity exit $?" >> "$OUT/fidelity.log"
tail -30 "$OUT/fidelity.log"
