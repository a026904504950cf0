#!/usr/bin/env bash
# Issue 30: the Accelerate export as it now reads (2026-12-06: the bf16 and torchao setups compile each decoder
# block through Accelerate's regional compilation), at the bench's 4-block 8B-width shape: its BF16 run, the
# torchao setup's two policies, each beside precsearch's memory model (the compiled rule). Compare the speed-ups
# with the probe rows of a call on the same warm machine (scripts/gpu_torchtitan.sh), or add "probe" to
# FRAMEWORKS. About 4 min.
#   run(command="bash scripts/gpu_accelerate.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
export TESTS=0
NAME="${NAME:-accelerate_compiled}" BENCH_TIMEOUT="${BENCH_TIMEOUT:-540}" BENCH_ARGS="--frameworks \
${FRAMEWORKS:-accelerate} --policies ${POLICIES:-bf16 fp8_current bf16_edges+fp8_current} --deadline \
${DEADLINE:-500} --run-timeout ${RUN_TIMEOUT:-180}" bash scripts/gpu_frameworks.sh
