#!/usr/bin/env bash
# Issue 30: the Accelerate export as it now reads (2026-12-06: the bf16 and torchao setups compile each decoder
# block through Accelerate's regional compilation), at the bench's 4-block 8B-width shape: its BF16 run, the
# torchao setup's two policies and the memory-knob policy (BF16 model, TE FusedAdam; set against the BF16 row
# bf16+fp32_master, a BF16 model with TE FusedAdam's FP32 master and moments, which the bench adds), each beside precsearch's
# memory model (the compiled rule) and the probe's run of the same policy in the same call. About 4 min on an
# H100 (2026-12-06 ran the Accelerate rows without the probe's: FRAMEWORKS=accelerate).
#   run(command="bash benchmarks/gpu/gpu_accelerate.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
export TESTS=0
NAME="${NAME:-accelerate_compiled}" BENCH_TIMEOUT="${BENCH_TIMEOUT:-540}" BENCH_ARGS="--frameworks \
${FRAMEWORKS:-accelerate probe} --policies ${POLICIES:-bf16 fp8_current bf16_edges+fp8_current fp8_current+bf16_moments} --deadline \
${DEADLINE:-500} --run-timeout ${RUN_TIMEOUT:-180}" bash "$(dirname "$0")/gpu_frameworks.sh"
