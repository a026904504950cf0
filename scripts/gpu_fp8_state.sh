#!/usr/bin/env bash
# Issue 31, the fast FP8-moment step, on one H200 in one call:
#   1. the GPU tests of FP8StateAdamW (kernels vs its eager path and vs TE FusedAdam) and of the memory knobs
#      (which now step FP8 moments with it);
#   2. scripts/bench_memory_knobs.py at the Llama-3-8B width (24 layers, seq 4096, mb 1): the FP8-moment rows
#      under TE's FusedAdam and under FP8StateAdamW (``*_ps``), side by side with the standard rows.
#   run(command="bash scripts/gpu_fp8_state.sh", carry=[".gpu"], timeout_s=600)
#   3. NAN=1: scripts/fp8_moment_nan.py, where FusedAdam's FP8 moments with a whole FP32 master go NaN;
#   4. STUDY=1: the shipped 8B space's study (`precsearch run`, 16 trials), its front, its store as a tarball;
#   5. TARGET=1: scripts/bench_target.py on that front at LAYERS layers (default 32, the 8B target; STEPS, default
#      10) with the store from .carry/study_store.tgz (optuna.db + precsearch.json) when this machine has none.
# ROWS= the bench rows (default below); TESTS=0 skips the tests; BENCH=0 skips the bench.
# Calls of 2026-12-04: 1 = defaults (before fp8_block); 2 = BENCH=0 NAN=1 STUDY=1 (the space with TE's per-tensor
# fp8 moments: every such trial diverged); 3 = STUDY=1 (fp8_block); 4 = BENCH=0 TARGET=1 LAYERS=24 STEPS=15;
# 5 = TESTS=0 BENCH=0 TARGET=1 (32 layers, 10 steps; run then as the same bench_target.py command by hand).
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_fp8_state_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import triton; print('triton', triton.__version__)"
if [ "${TESTS:-1}" = "1" ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -s tests/backends/test_gpu_fp8_state_adam.py \
      tests/backends/test_gpu_memory_knobs.py > "$OUT/gpu_tests.log" 2>&1
  echo "pytest exit $?" >> "$OUT/gpu_tests.log"
  grep -E "passed|failed|error|FAILED|^E |ours - FusedAdam|step transient|: state|: peak" "$OUT/gpu_tests.log" | tail -60
fi
ROWS="${ROWS:-bf16_std fp8_std fp8_rem_m_bf16 fp8_rem_m_fp8 fp8_rem_m_fp8_ps fp8_m_fp8 fp8_m_fp8_ps fp8_rem_m_fp8_dpa_ps fp8_rem_m1_fp8_m2_bf16_ps bf16_rem_m_fp8_ps fp8_rem_m_fp8b_ps fp8_m_fp8b_ps bf16_rem_m_fp8b_ps}"
if [ "${BENCH:-1}" = "1" ]; then
  timeout "${BENCH_TIMEOUT:-330}" python3 scripts/bench_memory_knobs.py ${KNOB_ARGS:---layers 24 --seq 4096 --mb 1} \
      --rows $ROWS --json "$OUT/bench_memory_knobs.json" > "$OUT/bench_memory_knobs.log" 2>&1
  echo "bench_memory_knobs exit $?" >> "$OUT/bench_memory_knobs.log"
  tail -32 "$OUT/bench_memory_knobs.log"
fi
if [ "${NAN:-0}" = "1" ]; then
  timeout 120 python3 scripts/fp8_moment_nan.py --layers 24 --json "$OUT/fp8_moment_nan.json" > "$OUT/fp8_moment_nan.log" 2>&1
  echo "fp8_moment_nan exit $?" >> "$OUT/fp8_moment_nan.log"
  grep -v Warning "$OUT/fp8_moment_nan.log" | cut -c1-400 | tail -20
fi
SPACE=search_spaces/llama3_8b_h100.yaml
if [ "${STUDY:-0}" = "1" ]; then
  R=$PWD
  (cd /tmp && timeout "${STUDY_TIMEOUT:-400}" python3 -m precsearch run "$R/$SPACE" --output-dir /tmp/s8 --no-progress) \
      > "$OUT/study.log" 2>&1; echo "study exit $?"
  grep -v -i "warn\|INFO" "$OUT/study.log" | tail -24
  python3 -m precsearch front --output-dir /tmp/s8 --all > "$OUT/front_all.txt" 2>&1; tail -30 "$OUT/front_all.txt"
  tar czf "$OUT/study_store.tgz" -C /tmp s8
fi
if [ "${TARGET:-0}" = "1" ]; then
  [ -d /tmp/s8 ] || tar xzf .carry/study_store.tgz -C /tmp
  timeout "${TARGET_TIMEOUT:-420}" python3 scripts/bench_target.py "$SPACE" --study-dir /tmp/s8 --top "${TOP:-4}" --steps "${STEPS:-10}" \
      --layers "${LAYERS:-32}" --json "$OUT/bench_target.json" > "$OUT/bench_target.log" 2>&1
  echo "bench_target exit $?" >> "$OUT/bench_target.log"
  grep -v -i "warn" "$OUT/bench_target.log" | tail -20
fi
