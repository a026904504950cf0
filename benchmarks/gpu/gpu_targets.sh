#!/usr/bin/env bash
# Issue 52 item 4 on one H100/H200: for each target's shipped 8B space, the study as a user runs it, then its
# front's picks trained in that framework beside the framework's own BF16 run (bench_frameworks --from-study, 4
# blocks at the 8B width): the front's memory saved and speed-up against what the framework measured.
#   bash benchmarks/gpu/make_framework_bundle.sh    # here, once: .gpu/frameworks.tar.xz, .gpu/titan_wheels/
#   run(command="bash benchmarks/gpu/gpu_targets.sh", carry=[".gpu"], timeout_s=600)
# Knobs: TARGETS (default "accelerate megatron"; torchtitan's space compiles its probe's blocks: on an H100 its first
# trial had not finished in 200 s before each block variant compiled once, unmeasured since:
# search_spaces/llama3_8b_h100_<target>.yaml), TRIALS (each
# study's --n-trials, default 8), PICKS (front trials run per study, most memory saved first, default 2),
# LAYERS (default 4), BENCH_TIMEOUT (0: the study alone). Each study log line starts with the seconds since the
# study began. Writes under $OUT: card.txt, per target <t>_study.log, <t>_front.txt, <t>_all.txt, and
# <t>_from_study.{log,json}; each study itself as <t>_study.tar.gz (one file: the device returns few).
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_targets_out
source "$(dirname "$0")/gpu_env.sh"
gpu_frameworks_env
stamp() {  # each line of the input after the seconds since $1 (where a study's time goes)
  while IFS= read -r line; do printf '%4ds %s\n' "$(( $(date +%s) - $1 ))" "$line"; done
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
for t in ${TARGETS:-accelerate megatron}; do
  STUDY=/tmp/targets/$t
  rm -rf "$STUDY"
  start=$(date +%s)
  timeout "${STUDY_TIMEOUT:-200}" python3 -m precsearch run "search_spaces/llama3_8b_h100_$t.yaml" \
      --n-trials "${TRIALS:-8}" --output-dir "$STUDY" --no-progress 2>&1 | stamp "$start" > "$OUT/${t}_study.log"
  echo "precsearch run exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$OUT/${t}_study.log"
  python3 -m precsearch front --output-dir "$STUDY" > "$OUT/${t}_front.txt" 2>&1
  python3 -m precsearch front --all --output-dir "$STUDY" > "$OUT/${t}_all.txt" 2>&1
  cat "$OUT/${t}_all.txt"
  tar czf "$OUT/${t}_study.tar.gz" -C "$STUDY" precsearch.json optuna.db 2>/dev/null
  [ "${BENCH_TIMEOUT:-240}" = 0 ] && continue  # the study alone
  timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/bench_frameworks.py --from-study "$STUDY" \
      --max-picks "${PICKS:-2}" --layers "${LAYERS:-4}" --frameworks "$t" --deadline "${DEADLINE:-220}" \
      --json "$OUT/${t}_from_study.json" > "$OUT/${t}_from_study.log" 2>&1
  echo "bench_frameworks exit $?" >> "$OUT/${t}_from_study.log"
  tail -25 "$OUT/${t}_from_study.log"
done
