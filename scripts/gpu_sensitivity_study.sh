#!/usr/bin/env bash
# Issue 17 on one H200: the per-module 8B-wide study (search_spaces/llama3_8b_h200_per_module.yaml) with its
# sensitivity pass, the queued integer-program candidates and the front; then the measured per-unit
# forward+backward times (TE, BF16 vs FP8) that the sensitivity table's speed column only predicts.
#   run(command="bash scripts/gpu_sensitivity_study.sh", carry=[".gpu"], timeout_s=600)
set -uo pipefail
DEFAULT_OUT=/tmp/gpu_sensitivity_out
source "$(dirname "$0")/gpu_env.sh"
SPACE="${SPACE:-search_spaces/llama3_8b_h200_per_module.yaml}"
DIR=/tmp/sensitivity_study
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
start=$(date +%s)
timeout "${STUDY_TIMEOUT:-420}" python3 -m precsearch run "$SPACE" --output-dir "$DIR" --no-progress > "$OUT/study.log" 2>&1
echo "precsearch run exit $? after $(( $(date +%s) - start )) s" >> "$OUT/study.log"
python3 -m precsearch front --output-dir "$DIR" --all > "$OUT/front_all.txt" 2>&1
python3 - "$DIR" "$OUT" > "$OUT/trials.txt" 2>&1 <<'PY'
# each trial: queued candidate or sampled, predicted vs measured instability and memory saved
import json, sys
import optuna
from precsearch.search.guided import table_of
from precsearch.runtime.workspace import Workspace
ws = Workspace.load(sys.argv[1])
study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
table = table_of(study)
json.dump(table.to_dict(), open(f"{sys.argv[2]}/sensitivity_table.json", "w"), indent=1)
from precsearch.search.sensitivity import predict
print("trial state candidate pred_instability meas_instability pred_memory_saved meas_memory_saved "
      "pred_gemm_time_saved meas_speedup fp8_units")
for t in study.trials:
    s = t.user_attrs.get("score", {})
    pi, pm, ps = predict(table, t.params)
    print(t.number, t.state.name, t.user_attrs.get("candidate", "-"), f"{pi:.6f}", s.get("instability"),
          f"{pm:.4f}", s.get("memory_saved"), f"{ps:.3f}", s.get("speedup"), sum(v != "bf16" for v in t.params.values()))
PY
python3 - "$DIR" "$OUT" <<'PY'
# the heatmap the study logged to MLflow, copied out
import sys
from mlflow.tracking import MlflowClient
from precsearch.runtime.workspace import Workspace
import optuna, shutil
ws = Workspace.load(sys.argv[1])
study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
client = MlflowClient(ws.tracking_uri)
path = client.download_artifacts(study.user_attrs["mlflow_parent_run_id"], "sensitivity/heatmap.png")
shutil.copy(path, f"{sys.argv[2]}/sensitivity_heatmap.png")
PY
timeout 150 python3 scripts/gpu_unit_speed.py "$SPACE" "$OUT/unit_speed.json" > "$OUT/unit_speed.txt" 2>&1
echo "unit speed exit $?" >> "$OUT/unit_speed.txt"
grep -E "sensitivity|candidate|trial [0-9]+|failed|exit" "$OUT/study.log" | tail -40
cat "$OUT/trials.txt" "$OUT/front_all.txt" "$OUT/unit_speed.txt"
