#!/usr/bin/env bash
# Issue 54 item 3 on one H100/H200, in one call: the fixed-state reading judged on the soak's truth
# (benchmarks/bench_judge_soak.py). One BF16 run with the soak's set-up (2,000 annealed steps, bench_stack.Reference,
# seed 0) keeps its state at the probe's step and at 25/50/75/95% of the run; at each, every soak combination,
# the NaN before its fix (std_fp32_fp8block with the pre-fix arithmetic, planted in the bench only) and the graded
# planted series are read; the judge is against benchmarks/results/2026-12-07_bench_soak.json. Writes
# $OUT/<date>_bench_judge_soak.json (everything), $OUT/judge_soak.log (progress and the table), $OUT/gpu.txt and
# $OUT/gpu_util.log:
#   run(command="bash benchmarks/gpu/gpu_judge_soak.sh", carry=[".gpu"], timeout_s=600)
# STEPS (default 2000), PROBE_STEP (50), STATES ("0.25 0.5 0.75 0.95"), BATCHES (8), PLANTED_BITS ("0 1 2 3"; set
# empty for none), MEASURE (update_norm), STARVE_STEPS (800; 0: no planted starved state), TRUTH (the soak's report
# JSON, or its run cache .jsonl), JUDGE_TIMEOUT (s, default 480: the bench writes its JSON only at the end).
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_judge_soak_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
gpu_util_log "$OUT/gpu_util.log" 20
SECONDS=0
timeout -k 10 "${JUDGE_TIMEOUT:-480}" python3 benchmarks/bench_judge_soak.py --out "$OUT" --steps "${STEPS:-2000}" \
    --probe-step "${PROBE_STEP:-50}" --states ${STATES:-0.25 0.5 0.75 0.95} --batches "${BATCHES:-8}" \
    --planted-bits ${PLANTED_BITS-0 1 2 3} --measure "${MEASURE:-update_norm}" --starve-steps "${STARVE_STEPS:-800}" \
    --truth "${TRUTH:-benchmarks/results/2026-12-07_bench_soak.json}" > "$OUT/judge_soak.log" 2>&1
echo "bench_judge_soak exit $? after ${SECONDS} s" >> "$OUT/judge_soak.log"
grep -v -i "warn" "$OUT/judge_soak.log" | tail -80
