#!/usr/bin/env bash
# Issue 22 on one H200, in one call:
#   1. with TESTS set (a list of test files), the GPU tests of the memory knobs;
#   2. scripts/bench_memory_knobs.py at the Llama-3-8B width (KNOB_ARGS, default 24 layers, seq 4096, mb 1).
#   run(command="mkdir -p /tmp/site && tar xJf .gpu/site.tar.xz -C /tmp/site && cd .wt/mem && bash scripts/gpu_memory_knobs.sh",
#       carry=[".gpu", ".wt/mem"], timeout_s=600)
# The GPU tests alone (about 30 s of tests after TE's first import; the machine's start not included):
#   ... && cd .wt/mem && TESTS=tests/backends/test_gpu_memory_knobs.py BENCH=0 bash scripts/gpu_memory_knobs.sh
# The two 2026-11-30 calls: scripts/results/2026-11-30_h200_bench_memory_knobs_call{1,2}.{json,log} (call 1 ran
# before compact FP8 states existed: its FP8-moment rows are today's *_te rows).
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_memory_knobs_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -s $TESTS > "$OUT/gpu_tests.log" 2>&1
  echo "pytest exit $?" >> "$OUT/gpu_tests.log"
  grep -E "passed|failed|error|FAILED|^E " "$OUT/gpu_tests.log" | tail -30
fi
if [ "${BENCH:-1}" = "1" ]; then
  timeout "${BENCH_TIMEOUT:-330}" python3 scripts/bench_memory_knobs.py ${KNOB_ARGS:---layers 24 --seq 4096 --mb 1} \
      --json "$OUT/bench_memory_knobs.json" > "$OUT/bench_memory_knobs.log" 2>&1
  echo "bench_memory_knobs exit $?" >> "$OUT/bench_memory_knobs.log"
  tail -32 "$OUT/bench_memory_knobs.log"
fi
