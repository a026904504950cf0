#!/usr/bin/env bash
# Probes that span two GPUs (probe.nproc: 2, FSDP2 over NCCL), on a 2 x H200 machine:
#
#   run(command="bash scripts/gpu_fsdp.sh", kind="nvidia-h200-x2", carry=[".gpu"], timeout_s=600)
#
# tests:  the distributed-probe contract on TE (tests/backends/test_gpu_distributed.py): a tiny
#         model on 2 GPUs against the same probe on 1 GPU, per Hopper recipe (~1.5 min).
# trials: a BF16 reference and 4 FP8 policies of search_spaces/llama3_70b_h200x2.yaml (70B width
#         and sequence length 8192, 8 layers over 2 GPUs), each a torchrun launch, reporting
#         per-GPU peak memory, tokens/s and the loss gap vs BF16 (scripts/gpu_fsdp_trials.py).
#         Estimate per probe: ~9e14 FLOP a step (6 x 8.9e9 params x 16384 tokens + attention),
#         ~1.3 s a step at ~45% of 780 TFLOP/s on each GPU; 20 steps (15 under 'all') + ~35 s launch,
#         imports and build + eval: ~70 s a probe.
# all (default): both, in ~8 minutes. Logs and JSON land in $OUT.
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_fsdp_out
source "$(dirname "$0")/gpu_env.sh"

nvidia-smi --query-gpu=index,name,memory.total --format=csv 2>&1 | tee "$OUT/gpus.txt"
status=0
case "${1:-all}" in tests|all)
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/backends/test_gpu_distributed.py 2>&1 \
        | tee "$OUT/fsdp_tests.log"
    status=${PIPESTATUS[0]} ;;
esac
case "${1:-all}" in trials|all)
    # after the tests, 15 steps a probe so that the reference and 3-4 policies fit the call
    if [ "${1:-all}" = all ]; then budget=330; steps=15; else budget=520; steps=20; fi
    timeout $((budget + 40)) python3 scripts/gpu_fsdp_trials.py search_spaces/llama3_70b_h200x2.yaml \
        --json "$OUT/fsdp_trials.json" --budget-s "$budget" --steps "$steps" 2>&1 | tee "$OUT/fsdp_trials.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
esac
echo "== exit status $status"
exit "$status"
