#!/usr/bin/env bash
# The H200 runs behind the TE-backend and export issues, in the order they were made.
# Each block is one device call (see shared/device/README.md); run from the repo root:
#
#   run(command="bash scripts/gpu_study_apply_target.sh tests", carry=[".gpu"])
#   run(command="bash scripts/gpu_study_apply_target.sh study", carry=[".gpu"])          # study + apply check
#   run(command="bash scripts/gpu_study_apply_target.sh target", carry=[".gpu", ".carry"])  # needs the study in .carry/s8
#
# Results land in $OUT; the copies kept are under scripts/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD
OUT="${OUT:-/tmp/precsearch_out}"
mkdir -p /tmp/site "$OUT"
[ -d /tmp/site/transformer_engine ] || tar xJf .gpu/site.tar.xz -C /tmp/site || exit 2
export PYTHONPATH="/tmp/site:$R" PYTHONUNBUFFERED=1
SPACE=search_spaces/llama3_8b_h100.yaml

case "${1:-}" in
  tests)
    bash scripts/gpu_check.sh ;;
  study)
    (cd /tmp && timeout 300 python3 -m precsearch run "$R/$SPACE" --output-dir /tmp/s8 --no-progress) \
        > "$OUT/study.log" 2>&1; echo "study exit $?"
    grep -v -i "warn\|INFO" "$OUT/study.log" | tail -24
    python3 -m precsearch front --output-dir /tmp/s8 --all > "$OUT/front_all.txt"
    tar czf "$OUT/study_store.tgz" -C /tmp s8
    timeout 60 python3 scripts/gpu_apply_check.py "$SPACE" /tmp/s8 --json "$OUT/apply_check.json" ;;
  target)
    [ -d /tmp/s8 ] || cp -r .carry/s8 /tmp/s8
    # --precision-only: here FP8 on every Linear with the baseline's FP32 master weights and moments does not fit
    # an 8B model on one H200 (the BF16 baseline itself peaked at 124.88 GiB on 2026-12-04: gpu_fp8_state.sh)
    timeout 420 python3 scripts/bench_target.py "$SPACE" --study-dir /tmp/s8 --top 3 --steps 15 \
        --precision-only --json "$OUT/bench_target.json" ;;
  *)
    echo "usage: $0 tests|study|target" >&2; exit 2 ;;
esac
