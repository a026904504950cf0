#!/usr/bin/env bash
# A study with fidelity rungs on one H200: search_spaces/llama3_8b_h100_rungs.yaml (16 trials at 40 steps,
# 4 promoted to 120, then to 400), then its front with every trial and rung.
#   run(command="bash scripts/gpu_rungs_study.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_rungs_out
source "$(dirname "$0")/gpu_env.sh"
SPACE="${SPACE:-search_spaces/llama3_8b_h100_rungs.yaml}"
if [ -n "${RUNGS:-}${PROMOTE:-}" ]; then  # a shorter variant when device time is short: RUNGS="40, 120, 240" PROMOTE=3
    sed -e "s/rungs: \[[0-9, ]*\]/rungs: [${RUNGS:-40, 120, 400}]/" -e "s/promote: [0-9]*/promote: ${PROMOTE:-4}/" \
        "$SPACE" > /tmp/rungs_space.yaml
    SPACE=/tmp/rungs_space.yaml
    grep -E "rungs:|promote:" "$SPACE"
fi
DIR=/tmp/rungs_study
df -h /tmp | tail -1
start=$(date +%s)
timeout "${STUDY_TIMEOUT:-480}" python3 -m precsearch run "$SPACE" --output-dir "$DIR" > "$OUT/study.log" 2>&1
echo "precsearch run exit $? after $(( $(date +%s) - start )) s" >> "$OUT/study.log"
python3 -m precsearch front --output-dir "$DIR" --all > "$OUT/front_all.txt" 2>&1
python3 -m precsearch front --output-dir "$DIR" > "$OUT/front.txt" 2>&1
python3 - "$DIR" > "$OUT/rungs.txt" 2>&1 <<'PY'
# every trial with its rung, what it continues, and its verdict, straight from the Optuna storage
import sys
import optuna
from precsearch.runtime.workspace import Workspace
ws = Workspace.load(sys.argv[1])
study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
for t in study.trials:
    a, s = t.user_attrs, t.user_attrs.get("score", {})
    shown = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in s.items()
             if any(w in k for w in ("gap", "instab", "feasible", "risk", "memory_saved", "noise"))}
    print(t.number, t.state.name, "steps", a.get("fidelity_steps"), "from", a.get("promoted_from"),
          "dup", a.get("duplicate_of"), shown, "params", t.params)
PY
df -h /tmp | tail -1; ls -la "$DIR/checkpoints" "$DIR/references" 2>&1 | head -20
grep -E "promoted|not written|trial [0-9]+ |finished" "$OUT/study.log" | tail -40; tail -5 "$OUT/study.log"; cat "$OUT/rungs.txt"; cat "$OUT/front.txt"
