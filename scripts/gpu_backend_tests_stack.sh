#!/usr/bin/env bash
# Issue 13 on one H200, in one call:
#   1. the GPU tests of the backends: the TE stack, the contract on every backend, TE/torchao checks, diagnostics;
#   2. scripts/bench_stack.py: the probe against a plain te.TransformerLayer stack (STACK_ARGS, default
#      the Llama-3-8B shape at 32 layers, diagnostics on and off);
#   3. with MEMORY=1, scripts/bench_memory.py (memory model calibrated on 2/4 blocks vs full depth).
#   run(command="bash scripts/gpu_backend_tests_stack.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_backend_tests_stack_out
source "$(dirname "$0")/gpu_env.sh"
TESTS="${TESTS:-tests/backends/test_gpu_te_stack.py tests/backends/test_contract.py tests/backends/test_gpu_backends.py tests/backends/test_gpu_diagnostics.py}"
if [ "$TESTS" != "none" ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -s $TESTS ${TEST_K:+-k "$TEST_K"} \
      > "$OUT/gpu_tests.log" 2>&1
  echo "pytest exit $?" >> "$OUT/gpu_tests.log"
  grep -E "passed|failed|error|dB|FAILED|^E " "$OUT/gpu_tests.log" | tail -40
fi
if [ "${STACK:-1}" = "1" ]; then
  timeout "${STACK_TIMEOUT:-420}" python3 scripts/bench_stack.py ${STACK_ARGS:---layers 32 --steps 12 --diagnostics both} \
      --json "$OUT/bench_stack.json" > "$OUT/bench_stack.log" 2>&1
  echo "bench_stack exit $?" >> "$OUT/bench_stack.log"
  tail -25 "$OUT/bench_stack.log"
fi
if [ "${MEMORY:-0}" = "1" ]; then
  python3 scripts/bench_memory.py --budget-s "${MEM_BUDGET:-330}" --out "$OUT" > "$OUT/bench_memory.log" 2>&1
  echo "bench_memory exit $?" >> "$OUT/bench_memory.log"
  tail -20 "$OUT/bench_memory.log"
fi
if [ "${STUDY:-0}" = "1" ]; then
  # a 16-trial study of llama3_8b_h100.yaml timed phase by phase, then its front at full depth
  timeout "${STUDY_TIMEOUT:-300}" python3 scripts/bench_probe.py search_spaces/llama3_8b_h100.yaml --trials 16 \
      --workdir /tmp/bench_probe --json "$OUT/bench_probe.json" > "$OUT/bench_probe.log" 2>&1
  echo "bench_probe exit $?" >> "$OUT/bench_probe.log"
  tail -22 "$OUT/bench_probe.log"
  python3 -m precsearch front --output-dir /tmp/bench_probe/study --all > "$OUT/study_front.txt" 2>&1
  head -40 "$OUT/study_front.txt"
  [ "${TARGET:-1}" = "1" ] && timeout "${TARGET_TIMEOUT:-240}" python3 scripts/bench_target.py search_spaces/llama3_8b_h100.yaml \
      --study-dir /tmp/bench_probe/study --top 3 --steps 12 --json "$OUT/bench_target.json" > "$OUT/bench_target.log" 2>&1
  [ "${TARGET:-1}" = "1" ] && { echo "bench_target exit $?" >> "$OUT/bench_target.log"; tail -20 "$OUT/bench_target.log"; }
fi
if [ "${NOISE:-0}" = "1" ]; then
  # issue 14: final vs tail reading and the risk score, BF16 seeds against uniform FP8 recipes
  timeout "${NOISE_TIMEOUT:-150}" python3 scripts/gpu_noise_floor.py search_spaces/llama3_8b_h100.yaml --seeds 3 \
      --json "$OUT/verdicts.json" > "$OUT/verdicts.log" 2>&1
  echo "gpu_noise_floor exit $?" >> "$OUT/verdicts.log"
  tail -8 "$OUT/verdicts.log"
fi
