#!/usr/bin/env bash
# Issue 29 on one H200: trials per GPU-hour of the shipped 8B study, with the run's trace (PRECSEARCH_TRACE) saying
# what the probe process (it holds the GPU) waited for.
#   STAGE=compare  benchmarks/bench_probe.py --compare: the TRIALS-trial (default 16) study with the code and the
#                  shipped space before (BEFORE: .before/precsearch and .before/llama3_8b_h100.yaml, the package and
#                  the space file at the commit before) and this checkout's (AFTER), back to back in one call;
#   STAGE=pair     the same two studies, each in its own bench_probe process (--only before, then --only after,
#                  TIMEOUT_BEFORE / TIMEOUT_AFTER seconds): a study cut short keeps the other's JSON; merge them here
#                  with `python benchmarks/bench_probe.py --merge BEFORE.json AFTER.json`;
#   STAGE=long     the AFTER study alone, TRIALS (default 64) trials, for the share of a long study.
# BEFORE=DIR picks another tree than .before (DIR/precsearch, DIR/llama3_8b_h100.yaml); SPACE the AFTER study's
# space. The issue's own baseline, the code and space of 7e7c4bd (2026-11-30, the day issue 29's 11.44 s a trial was
# measured) against this code on that same space (the same work on both sides):
#   BEFORE=.before_issue SPACE=.before_issue/llama3_8b_h100.yaml NAME=issue16 STAGE=compare bash benchmarks/gpu/gpu_study_throughput.sh
#   run(command="STAGE=compare bash benchmarks/gpu/gpu_study_throughput.sh", carry=[".gpu", ".before"], timeout_s=600)
#   run(command="STAGE=long bash benchmarks/gpu/gpu_study_throughput.sh", carry=[".gpu"], timeout_s=600)
# Make .before here first: git archive COMMIT precsearch | tar -x -C .before &&
#   git show COMMIT:search_spaces/llama3_8b_h100.yaml > .before/llama3_8b_h100.yaml (the same for .before_issue)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_study_out
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SPACE="${SPACE:-search_spaces/llama3_8b_h100.yaml}"
# ONLY_ON=H200: stop at once on another card (an H100's BEFORE study of 16 trials outruns a call's 10 minutes:
# its two clipping values' states go to host memory, each pinned tensor by tensor in the code before)
if [ -n "${ONLY_ON:-}" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "$ONLY_ON"; then
  echo "not an $ONLY_ON: nothing run"; exit 3
fi
case "${STAGE:-compare}" in
  compare)
    BEFORE="${BEFORE:-.before}"
    [ -f "$BEFORE/precsearch/__init__.py" ] || { echo "carry $BEFORE (the package before the change)" >&2; exit 2; }
    NAME="${NAME:-compare${TRIALS:-16}}"
    timeout "${TIMEOUT:-570}" python3 benchmarks/bench_probe.py "$SPACE" --trials "${TRIALS:-16}" --compare \
        --before-code "$BEFORE" --before-space "$BEFORE/llama3_8b_h100.yaml" --workdir /tmp/bench_study \
        --json "$OUT/bench_probe_$NAME.json" > "$OUT/bench_probe_$NAME.log" 2>&1
    echo "bench_probe exit $?" >> "$OUT/bench_probe_$NAME.log"
    tail -70 "$OUT/bench_probe_$NAME.log"
    cp /tmp/bench_study/after/study/trace.jsonl "$OUT/trace_$NAME.jsonl" 2>/dev/null
    ;;
  pair)
    BEFORE="${BEFORE:-.before}"
    [ -f "$BEFORE/precsearch/__init__.py" ] || { echo "carry $BEFORE (the package before the change)" >&2; exit 2; }
    NAME="${NAME:-pair${TRIALS:-16}}"
    for variant in before after; do
      limit=TIMEOUT_${variant^^}
      timeout "${!limit:-280}" python3 benchmarks/bench_probe.py "$SPACE" --trials "${TRIALS:-16}" --only "$variant" \
          --before-code "$BEFORE" --before-space "$BEFORE/llama3_8b_h100.yaml" --workdir /tmp/bench_study \
          --json "$OUT/bench_probe_${NAME}_$variant.json" >> "$OUT/bench_probe_$NAME.log" 2>&1
      echo "bench_probe --only $variant exit $?" >> "$OUT/bench_probe_$NAME.log"
    done
    tail -60 "$OUT/bench_probe_$NAME.log"
    cp /tmp/bench_study/after/study/trace.jsonl "$OUT/trace_$NAME.jsonl" 2>/dev/null
    ;;
  long)
    NAME="${NAME:-after${TRIALS:-64}}"
    timeout "${TIMEOUT:-570}" python3 benchmarks/bench_probe.py "$SPACE" --trials "${TRIALS:-64}" --only after \
        --workdir /tmp/bench_study --json "$OUT/bench_probe_$NAME.json" > "$OUT/bench_probe_$NAME.log" 2>&1
    echo "bench_probe exit $?" >> "$OUT/bench_probe_$NAME.log"
    tail -45 "$OUT/bench_probe_$NAME.log"
    cp /tmp/bench_study/after/study/trace.jsonl "$OUT/trace_$NAME.jsonl" 2>/dev/null
    # the trace holds every finished span even when the study outran TIMEOUT: the probe process's time by part
    python3 -m precsearch.runtime.timeline "$OUT/trace_$NAME.jsonl" > "$OUT/timeline_$NAME.txt" 2>&1
    grep -c '"trial probe"' "$OUT/trace_$NAME.jsonl" >> "$OUT/timeline_$NAME.txt"
    ;;
esac
