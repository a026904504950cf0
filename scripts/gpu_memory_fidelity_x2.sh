#!/usr/bin/env bash
# Issue 5 on a 2 x H200 machine, in one call (~8 min):
#   GPU 0: scripts/bench_memory.py (memory model vs measured peak, Llama-3-8B shape at full depth)
#   GPU 1: the GPU tests (scripts/gpu_check.sh), the diagnosis example, then scripts/bench_fidelity.py
#   run(command="bash scripts/gpu_memory_fidelity_x2.sh", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_memory_fidelity_x2_out
source "$(dirname "$0")/gpu_env.sh"
python3 scripts/bench_memory.py --gpu 0 --budget-s "${MEM_BUDGET:-380}" --out "$OUT" > "$OUT/mem.log" 2>&1 &
mem=$!
(
  export CUDA_VISIBLE_DEVICES=1
  OUT="$OUT" bash scripts/gpu_check.sh > /dev/null 2>&1
  python3 scripts/diagnose_example.py --out /tmp/diagnose > "$OUT/diagnose.log" 2>&1
  tar czf "$OUT/diagnose.tgz" -C /tmp diagnose 2>/dev/null
  timeout "${FID_TIMEOUT:-330}" python3 scripts/bench_fidelity.py --rungs ${RUNGS:-50 500} --seeds "${SEEDS:-1}" \
      --out "$OUT" > "$OUT/fidelity.log" 2>&1
  echo "fidelity exit $?" >> "$OUT/fidelity.log"
) &
rest=$!
wait $mem; echo "bench_memory exit $?" >> "$OUT/mem.log"
wait $rest
tail -5 "$OUT/gpu_tests.log"; cat "$OUT/diagnose.log" | tail -15; tail -30 "$OUT/mem.log"; tail -30 "$OUT/fidelity.log"
ls "$OUT"
