#!/usr/bin/env bash
# Issue 54 on one H100/H200, in parts (each call continues the run cache):
#   1. TESTS=1 (default): the GPU tests of FP8StateAdamW's kernels (the tiny-moment NaN among them) and of the
#      memory knobs;
#   2. benchmarks/bench_soak.py: long paired runs (2,000 annealed steps, 8 seeds) of COMBOS, PROCS at a time, for at
#      most BUDGET seconds, appending to the cache. The cache travels in and out: the call reads .carry/soak.jsonl
#      if there is one and writes $OUT/soak.jsonl (copy it back to .carry/ for the next call). The emulated rows of
#      stateless recipes run each step as a CUDA graph replay (NO_GRAPH=1: eagerly).
#   run(command="COMBOS='bf16_std std_fp32_fp8block' bash benchmarks/gpu/gpu_soak.sh", carry=[".gpu", ".carry"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_soak_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = "1" ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -s tests/backends/test_gpu_fp8_state_adam.py \
      tests/backends/test_gpu_memory_knobs.py > "$OUT/gpu_tests.log" 2>&1
  echo "pytest exit $?" >> "$OUT/gpu_tests.log"
  grep -E "passed|failed|error|FAILED|^E |step transient|: state|: peak" "$OUT/gpu_tests.log" | tail -40
fi
[ -f "$OUT/soak.jsonl" ] || { [ -f .carry/soak.jsonl ] && cp .carry/soak.jsonl "$OUT/soak.jsonl"; }
timeout "${SOAK_TIMEOUT:-560}" python3 benchmarks/bench_soak.py --combos ${COMBOS:-bf16_std} --seeds "${SEEDS:-8}" \
    --procs "${PROCS:-4}" --budget-s "${BUDGET:-400}" ${NO_GRAPH:+--no-graph} --cache "$OUT/soak.jsonl" \
    --json "$OUT/soak.json" \
    2>&1 | grep -v -i "warn" | tee "$OUT/soak.log" | tail -40
