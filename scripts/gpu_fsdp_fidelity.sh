#!/usr/bin/env bash
# Last H200 x2 call of 2026-11-29 (~9 min): the 70B-width FSDP2 probes of issue 9 on both GPUs, then the
# rest of the probe-fidelity comparison (same settings as the first part: --rungs 50 500 --seeds 1) split
# over the two GPUs, and the corrected diagnostics GPU test.
#   run(command="bash scripts/gpu_fsdp_fidelity.sh", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=590)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_final_out
source "$(dirname "$0")/gpu_env.sh"
timeout "${FSDP_TIMEOUT:-250}" python3 scripts/gpu_fsdp_trials.py search_spaces/llama3_70b_h200x2.yaml \
    --json "$OUT/fsdp_trials.json" --budget-s "${FSDP_BUDGET:-210}" --steps "${FSDP_STEPS:-12}" 2>&1 \
    | grep -v Warning | tee "$OUT/fsdp_trials.log"
fid() {  # GPU, JSON name, policies...
    local gpu=$1 name=$2; shift 2
    CUDA_VISIBLE_DEVICES=$gpu timeout "${FID_TIMEOUT:-280}" python3 scripts/bench_fidelity.py --rungs 50 500 --seeds 1 \
        --only "$@" --partial "$OUT/$name.json" --out /tmp > "$OUT/$name.log" 2>&1
}
fid 0 fidelity_fragile "E4M3" "fp8_delayed, 4x lr" &
a=$!
( CUDA_VISIBLE_DEVICES=1 timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu \
      tests/backends/test_gpu_diagnostics.py -k delayed_stats > "$OUT/diag_test.log" 2>&1
  fid 1 fidelity_lm_head "every Linear incl. lm_head" "fp8_current incl. lm_head" ) &
b=$!
wait $a $b
tail -3 "$OUT/diag_test.log"; tail -8 "$OUT/fidelity_fragile.log" "$OUT/fidelity_lm_head.log"
ls "$OUT"
