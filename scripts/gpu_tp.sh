#!/usr/bin/env bash
# Tensor parallelism on a 2 x H200 machine (probe.tp: 2, TE tp_group over NCCL):
#
#   run(command="bash scripts/gpu_tp.sh tests,tp", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=600)
#   run(command="bash scripts/gpu_tp.sh layouts", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=600)
#
# tests:   tests/backends/test_gpu_distributed.py: the TE probe on 2 GPUs, FSDP2 and TP=2 (with and
#          without sequence parallelism), against the same probe on one GPU (~3 min).
# tp:      search_spaces/llama3_70b_h200x2.yaml (70B width, seq 8192, 8 blocks, global batch 2) split
#          by TP=2 + SP: BF16, FP8 delayed, FP8 current; per-GPU peak measured vs the per-rank memory
#          model, tokens/s, loss gap (scripts/gpu_fsdp_trials.py, 10 steps a probe, ~1 min each).
# layouts: the same space and policies under FSDP2, TP=2 without SP and TP=2 + SP, side by side in one run
#          (the README's table; ~30 s a probe).
# study:   `precsearch run` end to end (workers, torchrun per trial, MLflow, the front) on that space with
#          probe.tp: 2: 2 BF16 reference seeds and 4 trials of 10 steps (~5 min).
# TEST_K selects tests (pytest -k).
# Logs and JSON land in $OUT.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_tp_out
source "$(dirname "$0")/gpu_env.sh"

nvidia-smi --query-gpu=index,name,memory.total --format=csv 2>&1 | tee "$OUT/gpus.txt"
status=0
what=",${1:-tests,tp},"
SPACE=search_spaces/llama3_70b_h200x2.yaml
if [[ $what == *,tests,* ]]; then
    timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/backends/test_gpu_distributed.py \
        ${TEST_K:+-k "$TEST_K"} 2>&1 \
        | tee "$OUT/tp_tests.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [[ $what == *,tp,* ]]; then
    timeout 330 python3 scripts/gpu_fsdp_trials.py "$SPACE" --json "$OUT/tp_trials.json" --budget-s 300 \
        --steps 10 --layouts tp --policies bf16/bf16,fp8_delayed/fp8_delayed,fp8_current/fp8_current 2>&1 \
        | tee "$OUT/tp_trials.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [[ $what == *,layouts,* ]]; then
    timeout 560 python3 scripts/gpu_fsdp_trials.py "$SPACE" --json "$OUT/layout_trials.json" --budget-s 520 \
        --steps 10 --layouts fsdp,tp-nosp,tp --policies bf16/bf16,fp8_delayed/fp8_delayed,fp8_current/fp8_current \
        2>&1 \
        | tee "$OUT/layout_trials.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [[ $what == *,study,* ]]; then
    python3 - "$SPACE" /tmp/tp_study.yaml <<'PY'
import sys, yaml
space = yaml.safe_load(open(sys.argv[1]))
space["probe"].update(tp=2, steps=10)
space["objectives"]["reference_seeds"] = 2
space["study"].update(name="llama3-70b-h200x2-tp2", n_trials=4)
yaml.safe_dump(space, open(sys.argv[2], "w"), sort_keys=False)
PY
    timeout 480 python3 -m precsearch run /tmp/tp_study.yaml --output-dir /tmp/tp_study --no-progress 2>&1 \
        | tee "$OUT/tp_study.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    python3 -m precsearch front --output-dir /tmp/tp_study --all 2>&1 | tee "$OUT/tp_study_front.txt"
fi
echo "== exit status $status"
exit "$status"
